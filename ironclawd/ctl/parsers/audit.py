"""``ironctl audit ...``: the arguments. The handlers are in ironclawd/ctl/audit.py,
imported only when one of these commands runs."""

from __future__ import annotations

import argparse
from typing import Any

from ironclawd.ctl import argtypes, exitcodes
from ironclawd.ctl.common import add_command


def register(sub: Any) -> None:
    audit = sub.add_parser("audit", help="the tamper-evident audit log", epilog=exitcodes.HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    audit_verbs = audit.add_subparsers(dest="verb", metavar="VERB", required=True)
    listing = add_command(audit_verbs, "list", "print audit records",
                          "ironctl audit list --after 100 --limit 50",
                          "audit:cmd_audit_list")  # fmt: skip
    listing.add_argument("--after", type=argtypes.int_range(0, argtypes.MAX_SEQ), default=0,
                         help="records after this seq")  # fmt: skip
    listing.add_argument("--limit", type=argtypes.int_range(1, 10_000), default=100,
                         help="at most this many records, 1 to 10000 (default 100)")  # fmt: skip
    add_command(audit_verbs, "verify", "check every record and link; names the first bad one",
                "ironctl audit verify", "audit:cmd_audit_verify")  # fmt: skip
