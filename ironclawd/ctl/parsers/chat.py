"""``ironctl send``, ``ironctl chat`` and ``ironctl session verify``: the arguments. The
handlers are in ironclawd/ctl/chat.py, imported only when one of these commands runs."""

from __future__ import annotations

from typing import Any

from ironclawd.ctl.argtypes import client_id
from ironclawd.ctl.common import add_command


def register(sub: Any, session_verbs: Any) -> None:
    send = add_command(
        sub,
        "send",
        "send one message to a session and print the agent's reply (for scripts)",
        "ironctl send SID 'hello'\n  echo hello | ironctl send SID - --json\n"
        "  ironctl send SID 'later' --no-wait",
        "chat:cmd_send",
    )
    send.add_argument("sid", metavar="SID", help="session id")
    send.add_argument("text", metavar="TEXT", help="the message, or - to read standard input")
    send.add_argument("--no-wait", action="store_true", help="queue it; do not wait for a reply")
    send.add_argument(
        "--client-id",
        metavar="ID",
        type=client_id,
        help="your id for this message (1-64 of A-Z a-z 0-9 . _ : -): sent again with the same "
        "id, it is queued once and the first one's reply is printed (safe retries)",
    )
    chat = add_command(
        sub,
        "chat",
        "talk to an agent: one line in, its reply out",
        "ironctl chat SID\n  ironctl chat --agent demo     # starts a session",
        "chat:cmd_chat",
    )
    chat.add_argument("sid", metavar="SID", nargs="?", help="session id")
    chat.add_argument(
        "--agent",
        help="start a new session of this agent (removed again if no message went to it)",
    )
    verify = add_command(
        session_verbs,
        "verify",
        "check that the agent has not rewritten or deleted replies the host already ingested "
        "(those it was told it may drop are counted apart)",
        "ironctl session verify SID",
        "chat:cmd_verify",
    )
    verify.add_argument("sid", metavar="SID", help="session id")
