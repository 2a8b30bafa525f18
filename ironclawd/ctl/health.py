"""``ironctl status`` and ``ironctl doctor``: the daemon's health and this host's readiness."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, render
from ironclawd.ctl.shapes import print_json

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub


def cmd_status(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=args.timeout)
    if args.json:
        print_json(reply)
    else:
        render.status(reply)
    return exitcodes.OK


def cmd_doctor(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.Doctor(admin_pb2.DoctorRequest(), timeout=args.timeout)
    checks = [c for c in reply.checks if c.name.startswith(args.only)]
    ok = not any(c.required and c.status == admin_pb2.CHECK_STATUS_FAIL for c in checks)
    if args.json:
        print_json(admin_pb2.DoctorResponse(checks=checks), ok=ok)
    else:
        render.doctor(checks, ok, legend=not args.no_legend)
    return exitcodes.OK if ok else exitcodes.FAILED
