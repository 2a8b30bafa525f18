"""``ironctl session ...``: create, list, show, start, stop, rm and logs of sandboxed sessions."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, render
from ironclawd.ctl.shapes import print_json, to_dict

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub


def cmd_create(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.CreateSession(
        admin_pb2.CreateSessionRequest(agent=args.agent, sid=args.sid or ""), timeout=args.timeout
    )
    _show(args, reply.session)
    return exitcodes.OK


def cmd_list(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.ListSessions(admin_pb2.ListSessionsRequest(), timeout=args.timeout)
    if args.json:
        print_json(reply)
    else:
        render.sessions(reply.sessions, legend=not args.no_legend)
    return exitcodes.OK


def cmd_show(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.GetSession(admin_pb2.GetSessionRequest(sid=args.sid), timeout=args.timeout)
    _show(args, reply.session)
    return exitcodes.OK


def cmd_start(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.StartSession(admin_pb2.StartSessionRequest(sid=args.sid), timeout=args.timeout)
    _show(args, reply.session)
    return exitcodes.OK


def cmd_stop(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.StopSession(admin_pb2.StopSessionRequest(sid=args.sid), timeout=args.timeout)
    _show(args, reply.session)
    return exitcodes.OK


def cmd_rm(args: argparse.Namespace, stub: Stub) -> int:
    stub.RemoveSession(
        admin_pb2.RemoveSessionRequest(sid=args.sid, force=args.force), timeout=args.timeout
    )
    if args.json:
        print(json.dumps({"removed": args.sid}))
    else:
        print(f"removed session {render.visible(args.sid)}")
    return exitcodes.OK


def cmd_logs(args: argparse.Namespace, stub: Stub) -> int:
    request = admin_pb2.SessionLogsRequest(sid=args.sid, lines=args.lines, follow=args.follow)
    # Following has no natural end: no deadline then; Ctrl-C ends it.
    timeout = None if args.follow else args.timeout
    for line in stub.SessionLogs(request, timeout=timeout):
        if args.json:
            print(json.dumps(to_dict(line)), flush=True)
        else:
            stamp = datetime.fromtimestamp(line.timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%S")
            print(f"{stamp} {line.source}: {render.visible(line.message)}", flush=True)
    return exitcodes.OK


def _show(args: argparse.Namespace, session: Any) -> None:
    if args.json:
        print_json(session)
    else:
        render.session(session)
