"""``ironctl wiring ...`` and ``ironctl permissions ...``: the arguments. The handlers are in
ironclawd/ctl/wiring.py, imported only when one of these commands runs."""

from __future__ import annotations

import argparse
from typing import Any

from ironclawd.ctl import exitcodes
from ironclawd.ctl.common import add_command


def register(sub: Any) -> None:
    wiring = sub.add_parser(
        "wiring", help="which channel rooms and webhook endpoints reach which agent",
        epilog=exitcodes.HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    verbs = wiring.add_subparsers(dest="verb", metavar="VERB", required=True)
    add_command(verbs, "list", "every agent's routes", "ironctl wiring list --json",
                "wiring:cmd_wiring_list")  # fmt: skip
    show = add_command(verbs, "show", "one agent's routes", "ironctl wiring show demo",
                       "wiring:cmd_wiring_show")  # fmt: skip
    show.add_argument("agent", metavar="AGENT")
    perms = sub.add_parser(
        "permissions", help="who may talk to an agent and who approves its changes",
        epilog=exitcodes.HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    perm_verbs = perms.add_subparsers(dest="verb", metavar="VERB", required=True)
    show = add_command(perm_verbs, "show", "an agent's permissions",
                       "ironctl permissions show demo --json",
                       "wiring:cmd_permissions_show")  # fmt: skip
    show.add_argument("agent", metavar="AGENT")
