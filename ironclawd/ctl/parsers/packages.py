"""``ironctl package ...``: the arguments. The handlers are in ironclawd/ctl/packages.py,
imported only when one of these commands runs."""

from __future__ import annotations

import argparse
from typing import Any

from ironclawd.ctl import exitcodes
from ironclawd.ctl.common import add_command


def register(sub: Any) -> None:
    group = sub.add_parser(
        "package",
        help="Debian packages of an agent: unpacked into its image only once approved",
        description="List an agent's Debian packages (with versions and .deb hashes) and submit "
        "packages changes (docs/packages.md). A change names packages only; the daemon "
        "resolves them with apt and a human approves the exact set.",
        epilog=exitcodes.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = group.add_subparsers(dest="verb", metavar="VERB", required=True)
    listing = add_command(
        verbs, "list", "list an agent's packages, dependencies included, with hashes",
        "ironctl package list --agent demo", "packages:cmd_list",
    )  # fmt: skip
    listing.add_argument("--agent", help="only this agent's packages")
    submitting = []
    for verb, help_text, example, handler in (
        ("add", "submit a change adding packages", "ironctl package add jq --agent demo",
         "packages:cmd_add"),
        ("remove", "submit a change removing packages", "ironctl package remove jq --agent demo",
         "packages:cmd_remove"),
        ("set", "submit a change setting the whole list (none: remove all)",
         "ironctl package set jq ripgrep --agent demo", "packages:cmd_set"),
    ):  # fmt: skip
        cmd = add_command(verbs, verb, help_text, example, handler)
        cmd.add_argument("names", metavar="NAME", nargs="+" if verb != "set" else "*",
                         help="Debian package names (no versions, no files)")  # fmt: skip
        submitting.append(cmd)
    for cmd in submitting:
        cmd.add_argument("--agent", required=True, help="target agent")
        cmd.add_argument("--reason", help="why (shown to the approver)")
