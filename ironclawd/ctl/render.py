"""Human output for ironctl: tables via rich, colour only on a terminal, NO_COLOR honoured."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

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


def _console() -> Console:
    # rich already honours NO_COLOR; colour is further limited to a real terminal.
    colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    return Console(no_color=not colour, highlight=False, soft_wrap=False)


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
