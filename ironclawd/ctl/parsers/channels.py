"""``ironctl channel ...``: the arguments. The handlers are in ironclawd/ctl/channels.py,
imported only when one of these commands runs."""

from __future__ import annotations

import argparse
from typing import Any

from ironclawd.ctl import exitcodes
from ironclawd.ctl.common import add_command


def register(sub: Any) -> None:
    group = sub.add_parser(
        "channel",
        help="the channels (Matrix, signed webhooks) people reach agents on",
        description="Status, counters and failed deliveries of each configured channel; a test "
        "of one end to end; messages held from unknown senders, to admit or drop "
        "(docs/channels.md).",
        epilog=exitcodes.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = group.add_subparsers(dest="verb", metavar="VERB", required=True)
    add_command(verbs, "list", "list channels with their status", "ironctl channel list",
                "channels:cmd_list")  # fmt: skip
    for verb, text, handler in (
        ("show", "show a channel: status, counters, failed deliveries", "channels:cmd_show"),
        ("test", "check a channel end to end without sending a message", "channels:cmd_test"),
    ):
        cmd = add_command(verbs, verb, text, f"ironctl channel {verb} chat", handler)
        cmd.add_argument("name", metavar="NAME", help="channel name (see: ironctl channel list)")
    add_command(verbs, "held", "list messages held from senders not allowed yet",
                "ironctl channel held --json", "channels:cmd_held")  # fmt: skip
    for verb, text, handler in (
        (
            "admit",
            "queue a held message to its agent, as if its sender were allowed",
            "channels:cmd_admit",
        ),
        ("drop", "delete a held message", "channels:cmd_drop"),
    ):
        cmd = add_command(verbs, verb, text, f"ironctl channel {verb} 3", handler)
        cmd.add_argument("id", metavar="ID", help="held message id (see: ironctl channel held)")
