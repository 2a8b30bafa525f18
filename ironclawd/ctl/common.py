"""Pieces every ironctl command shares: options, sub-command registration, errors, standard
input. Standard library only: building the parser imports nothing of grpc, protobuf or rich
(a command's handler module is imported when that command runs: ctl/main.py)."""

from __future__ import annotations

import argparse
import errno
import functools
import os
import stat
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from ironclawd.ctl import argtypes, exitcodes
from ironclawd.ctl.text import visible

if TYPE_CHECKING:
    from typing import TypeAlias

    from _typeshed import SupportsWrite

    from ironclaw.admin.v1.admin_pb2_grpc import AdminServiceStub
    from ironclawd.ctl.wire import RpcError

    # What every handler is given (for annotations only: the parser never imports grpc).
    Stub: TypeAlias = AdminServiceStub


class CtlError(Exception):
    """A failure ironctl reports itself (no daemon status): ``code`` names it in JSON errors,
    ``exit_code`` is from exitcodes, the message says what was wrong."""

    def __init__(self, code: str, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = exit_code


# A call that failed with these may have been done all the same (a message queued, a decision
# applied): the daemon took the request and its answer did not come (the deadline passed, the
# daemon went away, or failed after doing the work).
UNKNOWN_OUTCOME = frozenset({"DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED", "INTERNAL",
                             "UNKNOWN", "ABORTED", "DATA_LOSS"})  # fmt: skip
_DETAIL = 300  # characters of the daemon's words kept before what such a failure means


def outcome_unknown(err: RpcError) -> bool:
    """Whether the call that failed with ``err`` may have been done: not a refusal, and not a
    connect that never reached the daemon (wire.open_admin_socket's words)."""
    return err.code().name in UNKNOWN_OUTCOME and not err.details().startswith("connect to ")


def failed_call(err: RpcError, what: str) -> StatusError:
    """The daemon's status ``err`` (its code, exit code and words), and ``what`` it means."""
    code = err.code().name
    detail = visible(err.details())
    if len(detail) > _DETAIL:  # cut here: the whole message is cut later, and ``what`` is
        detail = f"{detail[:_DETAIL]}... (cut)"  # what the operator must read
    transport = getattr(err, "transport", None)  # (None: grpcio's, which does not say)
    return StatusError(code, f"{code.lower()}: {detail}; {what}", transport=transport)


class StatusError(CtlError):
    """A daemon's status (``code``, its name: no code of ironctl's own), with its exit code,
    and a message ironctl wrote: what the failure means for what was asked. ``transport``:
    the failure's own (wire.RpcError), to say what to do about a daemon not reached (rpc.py)."""

    def __init__(self, code: str, message: str, *, transport: bool | None = False) -> None:
        super().__init__(code, exitcodes.for_status(code), message)
        self.transport = transport


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

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse makes a formatter for every add_argument (to check the metavar), and each
        # one imported shutil for the terminal's width (with zlib, bz2 and lzma: ~3 ms of CPU
        # at every ironctl start). The same width, found as shutil.get_terminal_size() does.
        make: Callable[..., argparse.HelpFormatter] = self.formatter_class
        return make(prog=self.prog, width=terminal_columns() - 2)


def terminal_columns() -> int:
    """``shutil.get_terminal_size().columns`` without importing shutil: $COLUMNS if a positive
    number, else the width of standard output's terminal, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):  # no stdout, closed, or not a terminal
            columns = 0
    return columns or 80


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


# A key or signature file (minisign's: a few lines of base64 and a comment) is never near this.
SMALL_FILE_BYTES = 64 * 1024


class FileRefused(OSError):
    """A file read_file will not read: not a regular file, or larger than its limit. An
    OSError, so that it is reported as open(2)'s errors are: its filename and its strerror."""


def read_file(path: str, limit: int) -> bytes:
    """The bytes of the regular file at ``path``, refused (FileRefused) if it holds more than
    ``limit``. Opened without waiting (O_NONBLOCK): a FIFO, a device or a directory is refused,
    never waited on or read; at most ``limit + 1`` bytes are read, so /dev/zero or a huge file
    is refused, not read whole into memory. Other failures are open(2)'s and read(2)'s."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO, socket or device"
        raise FileRefused(errno.EINVAL, f"{kind}; expected a regular file", path)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise FileRefused(errno.EFBIG, f"more than {limit} bytes; expected at most {limit}", path)
    return data


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
        help="admin socket (default: /run/ironclaw/admin.sock; env IRONCLAW_ADMIN_SOCKET); "
        "refused unless root or you hold it",
    )
    common.add_argument(
        "--timeout",
        type=argtypes.timeout,
        default=60.0 if top else argparse.SUPPRESS,
        help="seconds to wait for the daemon (default 60, above 0, at most 86400)",
    )
    return common


@functools.cache
def _command_options() -> argparse.ArgumentParser:
    # One parent for every command (argparse shares a parent's actions with its children): a
    # parser of its own per command was a fifth of building ironctl's ~120 parsers.
    return common_options(top=False)


def add_command(
    sub: Any, name: str, helptext: str, examples: str, handler: str
) -> argparse.ArgumentParser:
    """A sub-command whose ``handler`` is "MODULE:FUNCTION" of ``ironclawd.ctl``: the module is
    imported only when this command runs (main.handler_of), so ``ironctl status`` never loads
    the code, protobuf messages or rich tables of the other commands."""
    cmd: argparse.ArgumentParser = sub.add_parser(
        name,
        help=helptext,
        description=helptext,
        epilog=f"examples:\n  {examples}\n\n{exitcodes.HELP}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_command_options()],
    )
    cmd.set_defaults(handler=handler)
    return cmd
