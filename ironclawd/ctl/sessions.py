"""``ironctl session ...``: create, list, show, start, stop, rm and logs of sandboxed sessions."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import argtypes, exitcodes, render
from ironclawd.ctl.common import Stub, add_command, print_json, to_dict


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


def register(sub: Any) -> Any:
    session = sub.add_parser(
        "session",
        help="sandboxed agent sessions",
        description="Create, inspect and stop sandboxed agent sessions.",
        epilog="examples:\n  ironctl session create --agent demo\n  ironctl session list\n"
        "  ironctl session logs SID --follow\n\n" + exitcodes.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = session.add_subparsers(dest="verb", metavar="VERB", required=True)
    create = add_command(
        verbs,
        "create",
        "start a new session of an agent in its own sandbox",
        "ironctl session create --agent demo\n  ironctl session create --agent demo --sid "
        "mytest0001 --json",
        cmd_create,
    )
    create.add_argument("--agent", required=True, help="agent name (e.g. demo)")
    create.add_argument("--sid", help="session id: 8-32 characters of [a-z0-9] (default: random)")
    add_command(verbs, "list", "list sessions", "ironctl session list --json", cmd_list)
    for verb, helptext, func in (
        ("show", "show one session", cmd_show),
        ("start", "start a stopped or failed session again", cmd_start),
        ("stop", "stop a session's sandbox (the session remains)", cmd_stop),
        ("rm", "remove a stopped session and everything of it", cmd_rm),
    ):
        cmd = add_command(verbs, verb, helptext, f"ironctl session {verb} SID", func)
        cmd.add_argument("sid", metavar="SID", help="session id")
        if verb == "rm":
            cmd.add_argument("--force", action="store_true", help="stop it first if it runs")
    logs = add_command(
        verbs,
        "logs",
        "show a session's sandbox log (its unit's journal)",
        "ironctl session logs SID -n 50\n  ironctl session logs SID --follow",
        cmd_logs,
    )
    logs.add_argument("sid", metavar="SID", help="session id")
    logs.add_argument("-n", "--lines", type=argtypes.int_range(1, 10_000), default=100,
                      help="last N lines, 1 to 10000 (default 100)")  # fmt: skip
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    return verbs
