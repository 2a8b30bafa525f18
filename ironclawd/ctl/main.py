"""ironctl: the operator's command line. It speaks only gRPC to ironclawd's admin socket."""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import traceback

import grpc

from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from ironclawd import __version__, paths
from ironclawd.ctl import (
    agents,
    api,
    argtypes,
    audit,
    changes,
    channels,
    chat,
    containment,
    exitcodes,
    mcp,
    packages,
    render,
    sessions,
    skills,
    wiring,
)
from ironclawd.ctl.common import (
    CtlError,
    Parser,
    Stub,
    UsageError,
    add_command,
    common_options,
    print_json,
)

DEFAULT_SOCKET = str(paths.ADMIN_SOCKET)
DEBUG_ENV = "IRONCTL_DEBUG"


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


def build_parser() -> argparse.ArgumentParser:
    socket_default = os.environ.get("IRONCLAW_ADMIN_SOCKET", DEFAULT_SOCKET)
    parser = Parser(
        prog="ironctl",
        description="Operate ironclawd: health, sandboxed agent sessions, changes, audit.",
        epilog="examples:\n  ironctl doctor\n  ironctl session create --agent demo\n"
        "  ironctl status --json\n  ironctl containment verify REPORT.json --pubkey KEY.pub\n\n"
        + exitcodes.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common_options(top=True, socket_default=socket_default)],
    )
    parser.add_argument("--version", action="version", version=f"ironctl {__version__}",
                        help="print ironctl's version and exit")  # fmt: skip
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_command(
        sub,
        "status",
        "show the daemon's version, uptime and who you are to it",
        "ironctl status\n  ironctl status --json | jq .caller.uid",
        cmd_status,
    )
    doctor = add_command(
        sub,
        "doctor",
        "check this host can run sandboxes; each failure comes with a fix",
        "ironctl doctor                 # table of checks with fix hints\n"
        "  ironctl doctor --json          # for scripts; exit 0 only if required checks pass\n"
        "  ironctl doctor --only runsc    # checks whose name starts with 'runsc'",
        cmd_doctor,
    )
    doctor.add_argument("--only", default="", help="only checks whose name has this prefix")
    verbs = sessions.register(sub)
    chat.register(sub, verbs)
    changes.register(sub)
    agents.register(sub)
    audit.register(sub)
    containment.register(sub)
    skills.register(sub)
    mcp.register(sub)
    packages.register(sub)
    wiring.register(sub)
    channels.register(sub)
    api.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one ironctl command. Every outcome is an exit code and at most a one-line error
    (JSON under --json): never a traceback, unless IRONCTL_DEBUG=1 asks for one."""
    args = sys.argv[1:] if argv is None else list(argv)
    as_json = _wants_json(args)
    _tolerant_streams()
    try:
        try:
            code = _run(args, as_json)
            sys.stdout.flush()  # here, not at exit, so a closed pipe is seen and handled
        except KeyboardInterrupt:
            return exitcodes.INTERRUPTED
        except BrokenPipeError:
            raise
        except Exception as exc:  # last resort: any bug is one line, not a traceback
            return _report(as_json, _internal(exc))
        else:
            return code
    except BrokenPipeError:
        # The reader went away (ironctl ... | head -1): stop quietly, as a program killed by
        # SIGPIPE would, and let nothing more reach the closed pipe at interpreter exit.
        _stdout_to_devnull()
        return exitcodes.PIPE_CLOSED


def _run(argv: list[str], as_json: bool) -> int:
    try:
        problem = argtypes.undecodable(argv)
        if problem is not None:
            raise UsageError(f"ironctl: {problem}")
        args = build_parser().parse_args(argv)
    except CtlError as err:
        return _report(as_json, err)
    except SystemExit as exc:  # --help was printed
        return exc.code if isinstance(exc.code, int) else exitcodes.USAGE
    channel = grpc.insecure_channel(f"unix:{args.socket}")
    try:
        code: int = args.func(args, admin_pb2_grpc.AdminServiceStub(channel))
    except grpc.RpcError as err:
        return _report_rpc_error(args, err)
    except CtlError as err:
        return _report(args.json, err, args.command)
    else:
        return code
    finally:
        channel.close()


def _wants_json(argv: list[str]) -> bool:
    # Before parsing (a usage error has no parsed arguments): --json or an abbreviation of it
    # that argparse would accept, anywhere before a "--".
    words = argv[: argv.index("--")] if "--" in argv else argv
    return any(len(w) >= 3 and "--json".startswith(w) for w in words)


def _report(as_json: bool, err: CtlError, command: str = "") -> int:
    message = argtypes.shown_message(str(err))
    if as_json:
        doc = {"error": {"code": err.code, "message": message, "exit": err.exit_code}}
        print(json.dumps(doc))
    else:
        prefix = f"ironctl: {command}: " if command else ""
        print(f"{prefix}{message}", file=sys.stderr)
    return err.exit_code


def _internal(exc: Exception) -> CtlError:
    if os.environ.get(DEBUG_ENV) == "1":
        traceback.print_exc()
        hint = ""
    else:
        hint = f" (set {DEBUG_ENV}=1 for a traceback)"
    return CtlError(
        "IRONCTL_INTERNAL",
        exitcodes.INTERNAL,
        f"ironctl: internal error in ironctl: {type(exc).__name__}: {exc}{hint}",
    )


def _tolerant_streams() -> None:
    # Text that cannot be encoded for this terminal (a C locale, say) is printed escaped.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


def _stdout_to_devnull() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # not a real file (a test's capture): nothing will be flushed to a pipe


def _report_rpc_error(args: argparse.Namespace, err: grpc.RpcError) -> int:
    code: grpc.StatusCode = err.code()
    detail: str = err.details() or ""
    exit_code = exitcodes.for_status(code)
    if code == grpc.StatusCode.UNAVAILABLE:
        detail = _explain_unavailable(args.socket, detail)
        if detail.startswith("permission denied"):
            exit_code = exitcodes.PERMISSION
    detail = argtypes.shown_message(detail)
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
