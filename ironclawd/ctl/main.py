"""ironctl: the operator's command line. It speaks only gRPC to ironclawd's admin socket."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from ironclawd.ctl import exitcodes, render

DEFAULT_SOCKET = "/run/ironclaw/admin.sock"

EXAMPLES = {
    "status": """examples:
  ironctl status
  ironctl status --json | jq .caller.uid""",
    "doctor": """examples:
  ironctl doctor                 # table of checks with fix hints
  ironctl doctor --json          # for scripts; exit code 0 only if every required check passes
  ironctl doctor --only runsc    # checks whose name starts with 'runsc'""",
}


def _common(*, top: bool) -> argparse.ArgumentParser:
    """Options accepted before or after the command. Only the top level sets defaults, so a
    value given before the command is not overwritten by the subcommand's default."""
    common = argparse.ArgumentParser(add_help=False)
    socket_default = os.environ.get("IRONCLAW_ADMIN_SOCKET", DEFAULT_SOCKET)
    common.add_argument(
        "--json",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="machine-readable output",
    )
    common.add_argument(
        "--socket",
        default=socket_default if top else argparse.SUPPRESS,
        help=f"admin socket (default: {socket_default}; env IRONCLAW_ADMIN_SOCKET)",
    )
    common.add_argument(
        "--timeout",
        type=float,
        default=60.0 if top else argparse.SUPPRESS,
        help="seconds to wait for the daemon (default 60)",
    )
    return common


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ironctl",
        description="Operate ironclawd: health, sandboxed agent sessions, changes, audit.",
        epilog="examples:\n  ironctl doctor\n  ironctl status --json\n\n" + exitcodes.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_common(top=True)],
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, helptext in (
        ("status", "show the daemon's version, uptime and who you are to it"),
        ("doctor", "check this host can run sandboxes; each failure comes with a fix"),
    ):
        cmd = sub.add_parser(
            name,
            help=helptext,
            description=helptext,
            epilog=EXAMPLES[name] + "\n\n" + exitcodes.HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            parents=[_common(top=False)],
        )
        if name == "doctor":
            cmd.add_argument("--only", default="", help="only checks whose name has this prefix")
    return parser


def _stub(args: argparse.Namespace) -> tuple[grpc.Channel, admin_pb2_grpc.AdminServiceStub]:
    channel = grpc.insecure_channel(f"unix:{args.socket}")
    return channel, admin_pb2_grpc.AdminServiceStub(channel)


def cmd_status(args: argparse.Namespace, stub: admin_pb2_grpc.AdminServiceStub) -> int:
    reply = stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=args.timeout)
    if args.json:
        _print_json(reply)
    else:
        render.status(reply)
    return exitcodes.OK


def cmd_doctor(args: argparse.Namespace, stub: admin_pb2_grpc.AdminServiceStub) -> int:
    reply = stub.Doctor(admin_pb2.DoctorRequest(), timeout=args.timeout)
    checks = [c for c in reply.checks if c.name.startswith(args.only)]
    ok = not any(c.required and c.status == admin_pb2.CHECK_STATUS_FAIL for c in checks)
    if args.json:
        doc = MessageToDict(
            admin_pb2.DoctorResponse(checks=checks),
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
        )
        doc["ok"] = ok
        print(json.dumps(doc, indent=2))
    else:
        render.doctor(checks, ok)
    return exitcodes.OK if ok else exitcodes.FAILED


COMMANDS: dict[str, Callable[[argparse.Namespace, admin_pb2_grpc.AdminServiceStub], int]] = {
    "status": cmd_status,
    "doctor": cmd_doctor,
}


def _print_json(message: Any) -> None:
    print(
        json.dumps(
            MessageToDict(
                message,
                preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True,
            ),
            indent=2,
        )
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    channel, stub = _stub(args)
    try:
        return COMMANDS[args.command](args, stub)
    except grpc.RpcError as err:
        return _report_rpc_error(args, err)
    finally:
        channel.close()


def _report_rpc_error(args: argparse.Namespace, err: grpc.RpcError) -> int:
    code: grpc.StatusCode = err.code()
    detail: str = err.details() or ""
    exit_code = exitcodes.for_status(code)
    if code == grpc.StatusCode.UNAVAILABLE:
        detail = _explain_unavailable(args.socket, detail)
        if detail.startswith("permission denied"):
            exit_code = exitcodes.PERMISSION
    if args.json:
        print(json.dumps({"error": {"code": code.name, "message": detail, "exit": exit_code}}))
    else:
        print(f"ironctl: {args.command}: {code.name.lower()}: {detail}", file=sys.stderr)
    return exit_code


def _explain_unavailable(socket_path: str, detail: str) -> str:
    if not os.path.exists(socket_path):
        return f"{socket_path} does not exist: is ironclawd running? (systemctl start ironclawd)"
    if not os.access(socket_path, os.R_OK | os.W_OK):
        return (
            f"permission denied on {socket_path}: you are not in group 'ironclaw-admin' "
            "(ask an administrator: adduser YOU ironclaw-admin; then log in again)"
        )
    return f"cannot reach ironclawd on {socket_path}: {detail}"


if __name__ == "__main__":
    sys.exit(main())
