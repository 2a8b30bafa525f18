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
        detail = _explain_unavailable(args.socket, detail)
        if detail.startswith("permission denied"):
            exit_code = exitcodes.PERMISSION
    detail = argtypes.shown_message(detail)
    if args.json:
        print(json.dumps({"error": {"code": code, "message": detail, "exit": exit_code}}))
    else:
        print(f"ironctl: {args.command}: {code.lower()}: {detail}", file=sys.stderr)
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
