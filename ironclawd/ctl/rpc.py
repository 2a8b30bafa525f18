"""One ironctl command against ironclawd: the channel on the admin socket, the stub, and a
daemon's gRPC status reported as one line (JSON under --json) with its exit code. Imported only
once the command line is parsed (ctl/main.py). The calls go through ctl/wire.py (h2), not
grpcio, whose import alone took ~35 ms of every command; only ``ironctl api`` (server
reflection) loads grpcio, and its errors are reported here the same way."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

from ironclaw.admin.v1 import admin_pb2
from ironclawd import __version__
from ironclawd.ctl import argtypes, exitcodes, wire
from ironclawd.ctl.common import StatusError

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub


class _Status(Protocol):
    @property
    def name(self) -> str: ...


class _Failed(Protocol):
    """A failed call, from wire.py or (``ironctl api``) from grpcio."""

    def code(self) -> _Status: ...
    def details(self) -> str | None: ...


def stub_for(channel: wire.Channel) -> Stub:
    """The admin service's stub on ``channel`` (the unit tests put their stub daemon here)."""
    service = admin_pb2.DESCRIPTOR.services_by_name["AdminService"]
    return cast("Stub", wire.Stub(channel, service))


def run(args: argparse.Namespace, handler: Callable[[argparse.Namespace, Stub], int]) -> int:
    channel = wire.Channel(args.socket, user_agent=f"ironctl/{__version__}")
    try:
        return handler(args, stub_for(channel))
    except wire.RpcError as err:
        return _report_rpc_error(args, err)
    except StatusError as err:  # a handler's words on a failed call: what to do is added
        raise _with_remedy(args.socket, err) from None
    except Exception as err:
        grpc = sys.modules.get("grpc")  # loaded only by ``ironctl api``
        if grpc is not None and isinstance(err, grpc.RpcError):
            return _report_rpc_error(args, cast("_Failed", err))
        raise
    finally:
        channel.close()


def _report_rpc_error(args: argparse.Namespace, err: _Failed) -> int:
    code = err.code().name
    detail: str = err.details() or ""
    exit_code = exitcodes.for_status(code)
    if code == "UNAVAILABLE":
        # Not in place of ``detail``: a handler's words there say what the command did (a
        # persona edit's text kept in a file it names), a daemon's what went wrong in it.
        remedy = unreachable(args.socket, getattr(err, "transport", None))
        if remedy is not None:
            detail, exit_code = f"{detail}; {remedy[0]}", remedy[1]
    detail = argtypes.shown_message(detail)
    if args.json:
        print(json.dumps({"error": {"code": code, "message": detail, "exit": exit_code}}))
    else:
        print(f"ironctl: {args.command}: {code.lower()}: {detail}", file=sys.stderr)
    return exit_code


def _with_remedy(socket_path: str, err: StatusError) -> StatusError:
    remedy = unreachable(socket_path, err.transport) if err.code == "UNAVAILABLE" else None
    if remedy is None:
        return err
    said = StatusError(err.code, f"{err}; {remedy[0]}")
    said.exit_code = remedy[1]
    return said


_RUNNING = "is ironclawd running? (systemctl status ironclawd; ironctl used --socket {})"


def unreachable(socket_path: str, transport: bool | None) -> tuple[str, int] | None:
    """What was wrong when ironctl did not reach the daemon on ``socket_path``, what to do,
    and the exit code (docs/ironctl.md: 3, or 4 for a socket this user may not use); None for
    a status the daemon sent (``transport`` False). grpcio's errors (``ironctl api``; None)
    do not say which they are: only what is found wrong with the socket is said of them."""
    if transport is False:
        return None
    try:
        os.stat(socket_path)
    except (FileNotFoundError, NotADirectoryError):
        return (f"{socket_path} does not exist: {_RUNNING.format(socket_path)}",
                exitcodes.UNAVAILABLE)  # fmt: skip
    except PermissionError:
        pass  # a directory on the way this user may not search
    except OSError as exc:  # a name too long, a symlink loop: no socket can be there
        return (f"cannot use {socket_path}: {exc.strerror or exc} (check --socket and "
                "IRONCLAW_ADMIN_SOCKET)", exitcodes.UNAVAILABLE)  # fmt: skip
    else:
        if os.access(socket_path, os.R_OK | os.W_OK):
            if not transport:
                return None
            return (f"no answer from ironclawd on {socket_path}: "
                    f"{_RUNNING.format(socket_path)}", exitcodes.UNAVAILABLE)  # fmt: skip
    return (f"permission denied on {socket_path}: you are not in group 'ironclaw-admin' (ask "
            "an administrator: adduser YOU ironclaw-admin; then log in again)",
            exitcodes.PERMISSION)  # fmt: skip
