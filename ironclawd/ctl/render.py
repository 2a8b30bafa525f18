"""Human output for ironctl. On a terminal: rich tables, colour unless NO_COLOR, wrapped at
word boundaries only (a cell wider than the screen overflows it: never a split word). Off a
terminal (piped, redirected): plain aligned columns, like ``systemctl --no-pager`` and ``podman
ps``: no box drawing, no colour, no wrapping whatever COLUMNS says, one row a line, at least two
spaces between columns. ``--no-legend`` drops the header and any title or summary line.

Cells are plain text, never markup: hostile text (a pattern's brackets, a sender's name) is
shown as written. Text from outside still goes through ``visible()`` first."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl.shapes import enum_name
from ironclawd.ctl.text import visible

__all__ = ["visible"]  # re-exported: render.visible is how the commands show outside text

# A cell: its text, or its text and a rich style (used only on a terminal).
Cell = str | tuple[str, str]

GAP = "  "  # between plain columns
EMPTY = "-"  # an empty cell, so that every row has every column

# The JSON spelling of each check status (shapes.enum_name), and how a terminal colours it.
_STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def cell_len(text: str) -> int:
    """Terminal cells ``text`` takes, as rich counts them, so that plain columns line up as
    rich's do. Printable ASCII is one cell a character (rich's own fast path); anything else
    asks rich.cells, imported only then (~1.4 ms of a command otherwise)."""
    if text.isascii() and text.isprintable():
        return len(text)
    from rich.cells import cell_len as rich_cell_len  # noqa: PLC0415 (see above)

    return rich_cell_len(text)


def is_terminal() -> bool:
    return sys.stdout.isatty()


def cell_text(cell: Cell) -> str:
    # A tab would throw columns out of line (and rich expands it past the width measured).
    return (cell if isinstance(cell, str) else cell[0]).replace("\t", " ")


def cell_style(cell: Cell) -> str:
    return "" if isinstance(cell, str) else cell[1]


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    *,
    legend: bool = True,
    title: str = "",
    summary: Cell = "",
) -> None:
    """A listing: one row per item under a header. ``title`` comes before it and ``summary``
    after it (e.g. what to do when there are no rows); ``legend=False`` drops all three."""
    if is_terminal():
        from ironclawd.ctl import terminal  # noqa: PLC0415 (rich: only on a terminal)

        terminal.rich_table(headers, rows, legend=legend, title=title)
    else:
        lines = ([title] if legend and title else []) + plain_table(
            headers if legend else None, rows
        )
        if lines:
            print("\n".join(lines))
    if legend and cell_text(summary):
        if is_terminal():
            from ironclawd.ctl import terminal  # noqa: PLC0415 (rich: only on a terminal)

            terminal.line(summary)
        else:
            print(cell_text(summary))


def fields(rows: Sequence[tuple[str, Cell]]) -> None:
    """One item: a key and its value a line, values aligned. A value's own newlines (a persona)
    continue under the value column."""
    if is_terminal():
        from ironclawd.ctl import terminal  # noqa: PLC0415 (rich: only on a terminal)

        terminal.rich_table((), rows, legend=False, title="", keys=True)
    else:
        print("\n".join(plain_fields([(k, cell_text(v)) for k, v in rows])))


def plain_table(headers: Sequence[str] | None, rows: Sequence[Sequence[Cell]]) -> list[str]:
    """Rows as aligned columns: a cell's newlines become "; " so that a row stays one line."""
    grid = [[_flat(cell_text(c)) for c in row] for row in rows]
    if headers is not None:
        grid.insert(0, list(headers))
    if not grid:
        return []
    widths = [max(cell_len(row[i]) for row in grid) for i in range(len(grid[0]))]
    return [_join(row, widths) for row in grid]


def plain_fields(rows: Sequence[tuple[str, str]]) -> list[str]:
    width = max((cell_len(k) for k, _ in rows), default=0)
    lines = []
    for key, value in rows:
        first, *more = (value or EMPTY).split("\n")
        lines.append(_join([key, first], [width, 0]))
        lines += [(" " * (width + len(GAP)) + line).rstrip() for line in more]
    return lines


def _flat(text: str) -> str:
    return "; ".join(line for line in text.split("\n") if line) or EMPTY


def _join(row: Sequence[str], widths: Sequence[int]) -> str:
    padded = [
        cell + " " * (width - cell_len(cell)) for cell, width in zip(row, widths, strict=True)
    ]
    return GAP.join(padded).rstrip()


def status(reply: admin_pb2.GetStatusResponse) -> None:
    fields(
        [
            ("daemon", f"ironclawd {reply.version} (pid {reply.pid}), {reply.state}"),
            ("uptime", f"{reply.uptime_seconds:.0f}s"),
            ("config", visible(reply.config_path)),
            ("you", f"uid {reply.caller.uid} ({visible(reply.caller.user_name)}), "
                    f"pid {reply.caller.pid}"),
            ("pool", ", ".join(f"{visible(row.agent)} {row.ready} ready" for row in reply.pool)
                     or "off"),
        ]
    )  # fmt: skip


def doctor(checks: Sequence[admin_pb2.Check], ok: bool, *, legend: bool = True) -> None:
    rows: list[list[Cell]] = []
    for check in checks:
        label = check_status(check.status)
        name = check.name if check.required else f"{check.name} (optional)"
        # Details come from the host: shown as text, never markup.
        rows.append([visible(name), (label, _STATUS_STYLE.get(label, "")),
                     visible(check.detail), visible(check.fix_hint)])  # fmt: skip
    summary = ("all required checks passed", "") if ok else ("required checks failed", "bold red")
    table(("CHECK", "STATUS", "DETAIL", "FIX"), rows, legend=legend, summary=summary)


def check_status(value: int) -> str:
    return enum_name(admin_pb2.CheckStatus.DESCRIPTOR, value)


def when(stamp: float) -> str:
    """A timestamp as people read it (UTC); "-" when not set."""
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%d %H:%M:%S") if stamp else EMPTY


def sessions(items: Sequence[admin_pb2.Session], *, legend: bool = True) -> None:
    rows = [[s.sid, visible(s.agent), _state(s), when(s.created_at), visible(s.error)]
            for s in items]  # fmt: skip
    hint = "" if items else "no sessions (create one: ironctl session create --agent demo)"
    table(("SID", "AGENT", "STATE", "CREATED", "ERROR"), rows, legend=legend, summary=hint)


def session(s: admin_pb2.Session) -> None:
    rows: list[tuple[str, Cell]] = [
        ("sid", s.sid),
        ("agent", visible(s.agent)),
        ("state", _state(s)),
        ("unit", s.unit),
        ("netns", s.netns),
        ("platform", s.platform or EMPTY),
        ("created", when(s.created_at)),
        ("updated", when(s.updated_at)),
        ("last active", when(s.last_active_at)),
    ]
    if s.error:
        rows.append(("error", visible(s.error)))
    if s.restarting:
        rows.append(("restarting", "an approved change's restart: it runs again on the agent's "
                     "new spec (ironctl session stop keeps it stopped)"))  # fmt: skip
    fields(rows)


def _state(s: admin_pb2.Session) -> str:
    """A session's state, and "(restarting)" while an approved change's restart marks it."""
    state = session_state(s.state)
    return f"{state} (restarting)" if s.restarting else state


def session_state(value: int) -> str:
    return enum_name(admin_pb2.SessionState.DESCRIPTOR, value)
