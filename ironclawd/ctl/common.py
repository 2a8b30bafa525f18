"""Pieces every ironctl command shares: options, sub-command registration, JSON output."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from ironclaw.admin.v1 import admin_pb2_grpc
from ironclawd.ctl import exitcodes

Stub = admin_pb2_grpc.AdminServiceStub
Handler = Callable[[argparse.Namespace, Stub], int]


def common_options(*, top: bool, socket_default: str = "") -> argparse.ArgumentParser:
    """Options accepted before or after the command. Only the top level sets defaults, so a
    value given before the command is not overwritten by the sub-command's default."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="machine-readable output",
    )
    common.add_argument(
        "--socket",
        default=socket_default if top else argparse.SUPPRESS,
        help="admin socket (default: /run/ironclaw/admin.sock; env IRONCLAW_ADMIN_SOCKET)",
    )
    common.add_argument(
        "--timeout",
        type=float,
        default=60.0 if top else argparse.SUPPRESS,
        help="seconds to wait for the daemon (default 60)",
    )
    return common


def add_command(
    sub: Any, name: str, helptext: str, examples: str, func: Handler
) -> argparse.ArgumentParser:
    cmd: argparse.ArgumentParser = sub.add_parser(
        name,
        help=helptext,
        description=helptext,
        epilog=f"examples:\n  {examples}\n\n{exitcodes.HELP}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common_options(top=False)],
    )
    cmd.set_defaults(func=func)
    return cmd


def to_dict(message: Message) -> dict[str, Any]:
    return MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def print_json(message: Message, **extra: Any) -> None:
    doc = to_dict(message)
    doc.update(extra)
    print(json.dumps(doc, indent=2))
