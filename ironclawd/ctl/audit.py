"""``ironctl audit ...``: print and verify the tamper-evident audit log."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, render
from ironclawd.ctl.shapes import print_json
from ironclawd.formats import audit as audit_format

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub


def cmd_audit_list(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.ListAudit(
        admin_pb2.ListAuditRequest(after_seq=args.after, limit=args.limit), timeout=args.timeout
    )
    if args.json:
        # Each record as the log holds it, a line each (its MAC covers exactly these bytes).
        for record in reply.records:
            print(record)
        return exitcodes.OK
    rows = []
    for record in reply.records:
        r = json.loads(record)
        extra = {k: v for k, v in r.items() if k not in ("seq", "time", "event", "actor",
                                                       "prev", "mac")}  # fmt: skip
        rows.append([str(r["seq"]), render.when(r["time"]), render.visible(r["event"]),
                     render.visible(str(r["actor"])),
                     render.visible(json.dumps(extra, sort_keys=True))])  # fmt: skip
    render.table(("SEQ", "TIME", "EVENT", "ACTOR", "DETAIL"), rows, legend=not args.no_legend)
    return exitcodes.OK


def cmd_audit_verify(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.VerifyAudit(admin_pb2.VerifyAuditRequest(), timeout=args.timeout)
    if args.json:
        print_json(reply)
    elif reply.ok:
        flag = "with" if reply.append_only else "WITHOUT"
        note = f"; {reply.problem}" if reply.problem else ""
        print(f"audit log intact: {reply.records} records ({flag} the append-only flag){note}")
    elif reply.problem.startswith(audit_format.UNKNOWN):
        # Not tampering as such: a newer ironclawd's record, which this version cannot check.
        print(f"audit log of an UNKNOWN FORMAT from record {reply.first_bad_seq}: {reply.problem}")
    else:
        print(f"audit log TAMPERED: first bad record {reply.first_bad_seq}: {reply.problem}")
    return exitcodes.OK if reply.ok else exitcodes.FAILED
