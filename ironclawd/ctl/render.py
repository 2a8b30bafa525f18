"""Human output for ironctl: tables via rich, colour only on a terminal, NO_COLOR honoured."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ironclaw.admin.v1 import admin_pb2

_STATUS = {
    admin_pb2.CHECK_STATUS_PASS: ("ok", "green"),
    admin_pb2.CHECK_STATUS_WARN: ("warn", "yellow"),
    admin_pb2.CHECK_STATUS_FAIL: ("FAIL", "bold red"),
    admin_pb2.CHECK_STATUS_SKIP: ("skip", "dim"),
}


def console() -> Console:
    return _console()


class _Console(Console):
    """rich's Console, but a closed pipe is left to ironctl's main() (exit 141, as for every
    other write), not turned into a silent exit 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "standard output closed")


def _console() -> Console:
    # rich already honours NO_COLOR; colour is further limited to a real terminal.
    colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    return _Console(no_color=not colour, highlight=False, soft_wrap=False)


def status(reply: admin_pb2.GetStatusResponse) -> None:
    table = Table(show_header=False, box=None)
    rows = [
        ("daemon", f"ironclawd {reply.version} (pid {reply.pid}), {reply.state}"),
        ("uptime", f"{reply.uptime_seconds:.0f}s"),
        ("config", reply.config_path),
        ("you", f"uid {reply.caller.uid} ({reply.caller.user_name}), pid {reply.caller.pid}"),
    ]
    for key, value in rows:
        table.add_row(key, escape(value))
    _console().print(table)


def doctor(checks: Sequence[admin_pb2.Check], ok: bool) -> None:
    console = _console()
    table = Table(show_lines=False)
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for check in checks:
        label, style = _STATUS.get(check.status, ("?", ""))
        name = check.name if check.required else f"{check.name} (optional)"
        # Details come from the host and may hold brackets: never let them act as markup.
        table.add_row(
            escape(name), f"[{style}]{label}[/]", escape(check.detail), escape(check.fix_hint)
        )
    console.print(table)
    console.print("all required checks passed" if ok else "[bold red]required checks failed[/]")


def visible(text: str, *, newlines: bool = False) -> str:
    """Make control, escape and bidi characters visible, so log text cannot restyle the
    terminal or reorder what the operator reads. Lone surrogates (bytes that were not UTF-8,
    kept by surrogateescape) show as the byte they stand for, and never fail to print."""
    out = []
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif (
            ch == "\t"
            or (newlines and ch == "\n")
            or (0x20 <= code < 0x7F)
            or (code >= 0xA0 and not _is_format(code))
        ):
            out.append(ch)
        else:
            out.append(f"\\u{code:04x}" if code > 0xFF else f"\\x{code:02x}")
    return "".join(out)


def _is_format(code: int) -> bool:
    # Bidi embeddings/overrides/isolates, zero-width characters (Unicode category Cf), line and
    # paragraph separators, and surrogates (which no terminal can be sent).
    return (
        code in range(0x200B, 0x2010)
        or code in range(0x2028, 0x202F)
        or code in range(0xD800, 0xE000)
        or code in range(0x2066, 0x206A)
        or code == 0xFEFF
    )


def _when(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%d %H:%M:%S") if stamp else "-"


def sessions(items: Sequence[admin_pb2.Session], names: dict[int, str]) -> None:
    table = Table()
    for column in ("SID", "AGENT", "STATE", "CREATED", "ERROR"):
        table.add_column(column, no_wrap=column == "SID", overflow="fold")
    for s in items:
        table.add_row(
            s.sid, escape(s.agent), names.get(s.state, "?"), _when(s.created_at),
            escape(visible(s.error)),
        )  # fmt: skip
    _console().print(table)
    if not items:
        _console().print("no sessions (create one: ironctl session create --agent demo)")


def session(s: admin_pb2.Session, names: dict[int, str]) -> None:
    table = Table(show_header=False, box=None)
    rows = [
        ("sid", s.sid),
        ("agent", s.agent),
        ("state", names.get(s.state, "?")),
        ("unit", s.unit),
        ("netns", s.netns),
        ("platform", s.platform or "-"),
        ("created", _when(s.created_at)),
        ("updated", _when(s.updated_at)),
        ("last active", _when(s.last_active_at)),
    ]
    if s.error:
        rows.append(("error", visible(s.error)))
    for key, value in rows:
        table.add_row(key, escape(value))
    _console().print(table)
