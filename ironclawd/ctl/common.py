"""Pieces every ironctl command shares: options, sub-command registration, JSON output (its
shapes: ctl/shapes.py)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from google.protobuf.message import Message

from ironclaw.admin.v1 import admin_pb2_grpc
from ironclawd.ctl import argtypes, exitcodes, shapes

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

Stub = admin_pb2_grpc.AdminServiceStub
Handler = Callable[[argparse.Namespace, Stub], int]


class CtlError(Exception):
    """A failure ironctl reports itself (no daemon status): ``code`` names it in JSON errors,
    ``exit_code`` is from exitcodes, the message says what was wrong."""

    def __init__(self, code: str, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = exit_code


class UsageError(CtlError):
    """The command line is wrong: exit 2, reported as text or, under --json, as JSON."""

    def __init__(self, message: str) -> None:
        super().__init__("USAGE", exitcodes.USAGE, message)


class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing and exiting, so that main() can
    report it in the shape --json asks for. Sub-command parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        # argparse swallows OSError here; a closed pipe must reach main() to end as one does.
        if message:
            (file or sys.stderr).write(message)


def read_stdin() -> str:
    """Standard input as text; bytes that are not UTF-8 are refused with where they are."""
    data = sys.stdin.buffer.read()
    return decode_stdin(data)


def decode_stdin(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CtlError(
            "INVALID_INPUT",
            exitcodes.INVALID,
            f"standard input is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}",
        ) from None


def common_options(*, top: bool, socket_default: str = "") -> argparse.ArgumentParser:
    """Options accepted before or after the command. Only the top level sets defaults, so a
    value given before the command is not overwritten by the sub-command's default."""
    common = Parser(add_help=False)
    common.add_argument(
        "--json",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="machine-readable output",
    )
    common.add_argument(
        "--no-legend",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="listings without the header line and any title or summary line (for scripts)",
    )
    common.add_argument(
        "--socket",
        default=socket_default if top else argparse.SUPPRESS,
        help="admin socket (default: /run/ironclaw/admin.sock; env IRONCLAW_ADMIN_SOCKET)",
    )
    common.add_argument(
        "--timeout",
        type=argtypes.timeout,
        default=60.0 if top else argparse.SUPPRESS,
        help="seconds to wait for the daemon (default 60, above 0, at most 86400)",
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
    """A message as ironctl's JSON shows it (ctl/shapes.py)."""
    return shapes.to_dict(message)


def print_json(message: Message, **extra: Any) -> None:
    doc = to_dict(message)
    doc.update(extra)
    print(json.dumps(doc, indent=2))
