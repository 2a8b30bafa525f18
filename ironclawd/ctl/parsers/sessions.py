"""``ironctl session ...``: the arguments. The handlers are in ironclawd/ctl/sessions.py,
imported only when one of these commands runs."""

from __future__ import annotations

import argparse
from typing import Any

from ironclawd.ctl import argtypes, exitcodes
from ironclawd.ctl.common import add_command


def register(sub: Any) -> Any:
    session = sub.add_parser(
        "session",
        help="sandboxed agent sessions",
        description="Create, inspect and stop sandboxed agent sessions.",
        epilog="examples:\n  ironctl session create --agent demo\n  ironctl session list\n"
        "  ironctl session logs SID --follow\n\n" + exitcodes.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = session.add_subparsers(dest="verb", metavar="VERB", required=True)
    create = add_command(
        verbs,
        "create",
        "start a new session of an agent in its own sandbox",
        "ironctl session create --agent demo\n  ironctl session create --agent demo --sid "
        "mytest0001 --json",
        "sessions:cmd_create",
    )
    create.add_argument("--agent", required=True, help="agent name (e.g. demo)")
    create.add_argument("--sid", help="session id: 8-32 characters of [a-z0-9] (default: random)")
    add_command(verbs, "list", "list sessions", "ironctl session list --json", "sessions:cmd_list")
    for verb, helptext, func in (
        ("show", "show one session", "sessions:cmd_show"),
        ("start", "start a stopped or failed session again", "sessions:cmd_start"),
        ("stop", "stop a session's sandbox (the session remains)", "sessions:cmd_stop"),
        ("rm", "remove a stopped session and everything of it", "sessions:cmd_rm"),
    ):
        cmd = add_command(verbs, verb, helptext, f"ironctl session {verb} SID", func)
        cmd.add_argument("sid", metavar="SID", help="session id")
        if verb == "rm":
            cmd.add_argument("--force", action="store_true", help="stop it first if it runs")
    logs = add_command(
        verbs,
        "logs",
        "show a session's sandbox log (its unit's journal)",
        "ironctl session logs SID -n 50\n  ironctl session logs SID --follow",
        "sessions:cmd_logs",
    )
    logs.add_argument("sid", metavar="SID", help="session id")
    logs.add_argument("-n", "--lines", type=argtypes.int_range(1, 10_000), default=100,
                      help="last N lines, 1 to 10000 (default 100)")  # fmt: skip
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    return verbs
