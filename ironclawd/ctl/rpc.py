"""One ironctl command against ironclawd: the channel on the admin socket, the stub, and a
daemon's gRPC status reported as one line (JSON under --json) with its exit code. Imported only
once the command line is parsed (ctl/main.py): grpc alone takes ~40 ms to import here."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from ironclaw.admin.v1 import admin_pb2_grpc
from ironclawd.ctl import argtypes, exitcodes

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub


def run(args: argparse.Namespace, handler: Callable[[argparse.Namespace, Stub], int]) -> int:
    channel = grpc.insecure_channel(f"unix:{args.socket}")
    try:
        return handler(args, admin_pb2_grpc.AdminServiceStub(channel))
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
