"""``ironctl containment ...``: the arguments. The handlers are in ironclawd/ctl/containment.py,
imported only when one of these commands runs."""

from __future__ import annotations

import argparse
from typing import Any

from ironclawd.ctl import exitcodes
from ironclawd.ctl.common import add_command

PUBKEY_ENV = "IRONCLAW_CONTAINMENT_PUBKEY"  # the trusted key when --pubkey is not given


def register(sub: Any) -> None:
    group = sub.add_parser(
        "containment",
        help="check a red-team run's signed containment report",
        description="Check the containment report a red-team run writes (make test).",
        epilog=exitcodes.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = group.add_subparsers(dest="verb", metavar="VERB", required=True)
    verify = add_command(
        verbs,
        "verify",
        "verify a containment report's signature and format, print it, judge it",
        "ironctl containment verify results/containment-report.json "
        "--pubkey build/containment/minisign.pub\n"
        "  ironctl containment verify REPORT.json --pubkey KEY.pub --json | jq .outcome\n\n"
        "exit 0 only if the signature is good, every attack was contained and the negative\n"
        "control saw an escape",
        "containment:cmd_verify",
    )
    verify.add_argument("report", metavar="REPORT.json", help="containment-report.json")
    verify.add_argument(
        "--pubkey",
        help=f"trusted minisign public key file (required unless ${PUBKEY_ENV} names one)",
    )
    verify.add_argument("--signature", help="signature file (default: REPORT.json.minisig)")
