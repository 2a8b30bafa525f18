"""``ironctl audit ...``: print and verify the tamper-evident audit log."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import argtypes, exitcodes, render
from ironclawd.ctl.common import Stub, add_command, to_dict


def cmd_audit_list(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.ListAudit(
        admin_pb2.ListAuditRequest(after_seq=args.after, limit=args.limit), timeout=args.timeout
    )
    for record in reply.records:
        if args.json:
            print(record)
        else:
            r = json.loads(record)
            extra = {k: v for k, v in r.items() if k not in ("seq", "time", "event", "actor",
                                                           "prev", "mac")}  # fmt: skip
            stamp = datetime.fromtimestamp(r["time"], UTC).strftime("%Y-%m-%dT%H:%M:%S")
            print(render.visible(f"{r['seq']:>6} {stamp} {r['event']:<22} {r['actor']} "
                                 f"{json.dumps(extra, sort_keys=True)}"))  # fmt: skip
    return exitcodes.OK


def cmd_audit_verify(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.VerifyAudit(admin_pb2.VerifyAuditRequest(), timeout=args.timeout)
    if args.json:
        print(json.dumps(to_dict(reply)))
    elif reply.ok:
        flag = "with" if reply.append_only else "WITHOUT"
        note = f"; {reply.problem}" if reply.problem else ""
        print(f"audit log intact: {reply.records} records ({flag} the append-only flag){note}")
    else:
        print(f"audit log TAMPERED: first bad record {reply.first_bad_seq}: {reply.problem}")
    return exitcodes.OK if reply.ok else exitcodes.FAILED


def register(sub: Any) -> None:
    audit = sub.add_parser("audit", help="the tamper-evident audit log", epilog=exitcodes.HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    audit_verbs = audit.add_subparsers(dest="verb", metavar="VERB", required=True)
    listing = add_command(audit_verbs, "list", "print audit records",
                          "ironctl audit list --after 100 --limit 50", cmd_audit_list)  # fmt: skip
    listing.add_argument("--after", type=argtypes.int_range(0, argtypes.MAX_SEQ), default=0,
                         help="records after this seq")  # fmt: skip
    listing.add_argument("--limit", type=argtypes.int_range(1, 10_000), default=100,
                         help="at most this many records, 1 to 10000 (default 100)")  # fmt: skip
    add_command(audit_verbs, "verify", "check every record and link; names the first bad one",
                "ironctl audit verify", cmd_audit_verify)  # fmt: skip
