"""``ironctl api ...``: the arguments. The handlers are in ironclawd/ctl/api.py,
imported only when one of these commands runs."""

from __future__ import annotations

import argparse
from typing import Any

from ironclawd.ctl import exitcodes
from ironclawd.ctl.common import add_command


def register(sub: Any) -> None:
    api = sub.add_parser(
        "api",
        help="the admin API itself, through server reflection (like grpcurl)",
        description="List, describe and call the admin API's methods by name, with JSON in and "
        "out. The daemon checks every call as it checks ironctl's own commands.",
        epilog=exitcodes.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = api.add_subparsers(dest="verb", metavar="VERB", required=True)
    listing = add_command(
        verbs, "list", "list the services, or one service's methods",
        "ironctl api list\n  ironctl api list ironclaw.admin.v1.AdminService", "api:cmd_list",
    )  # fmt: skip
    listing.add_argument("service", metavar="SERVICE", nargs="?", help="full or short name")
    describe = add_command(
        verbs, "describe", "show a service, method, message or enum as proto text",
        "ironctl api describe ironclaw.admin.v1.AdminService.GetAgent\n"
        "  ironctl api describe ironclaw.admin.v1.Session", "api:cmd_describe",
    )  # fmt: skip
    describe.add_argument("symbol", metavar="SERVICE|METHOD|TYPE")
    call = add_command(
        verbs, "call", "call a method with a JSON request; print the reply as JSON",
        "ironctl api call ironclaw.admin.v1.AdminService.GetAgent '{\"name\": \"demo\"}'\n"
        "  ironctl api call GetStatus\n"
        "  echo '{\"sid\": \"S\", \"lines\": 20}' | ironctl api call SessionLogs -   "
        "# one JSON object per line",
        "api:cmd_call",
    )  # fmt: skip
    call.add_argument(
        "method", metavar="METHOD", help="pkg.Service.Method, /pkg.Service/Method or its name"
    )
    call.add_argument("request", metavar="JSON", nargs="?", default="{}",
                      help="the request as JSON (default {}), or - for standard input")  # fmt: skip
