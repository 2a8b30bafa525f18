"""Human output for ironctl. On a terminal: rich tables, colour unless NO_COLOR, wrapped at
word boundaries only (a cell wider than the screen overflows it: never a split word). Off a
terminal (piped, redirected): plain aligned columns, like ``systemctl --no-pager`` and ``podman
ps``: no box drawing, no colour, no wrapping whatever COLUMNS says, one row a line, at least two
spaces between columns. ``--no-legend`` drops the header and any title or summary line.

Cells are plain text, never markup: hostile text (a pattern's brackets, a sender's name) is
shown as written. Text from outside still goes through ``visible()`` first."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl.shapes import enum_name

# A cell: its text, or its text and a rich style (used only on a terminal).
Cell = str | tuple[str, str]

GAP = "  "  # between plain columns
EMPTY = "-"  # an empty cell, so that every row has every column

# The JSON spelling of each check status (shapes.enum_name), and how a terminal colours it.
_STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def is_terminal() -> bool:
    return sys.stdout.isatty()


def console(width: int | None = None) -> Console:
    # rich already honours NO_COLOR; colour is further limited to a real terminal.
    colour = is_terminal() and "NO_COLOR" not in os.environ
    return _Console(no_color=not colour, highlight=False, soft_wrap=False, width=width)


class _Console(Console):
    """rich's Console, but a closed pipe is left to ironctl's main() (exit 141, as for every
    other write), not turned into a silent exit 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "standard output closed")


def _text(cell: Cell) -> str:
    # A tab would throw columns out of line (and rich expands it past the width measured).
    return (cell if isinstance(cell, str) else cell[0]).replace("\t", " ")


def _style(cell: Cell) -> str:
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
        _rich_table(headers, rows, legend=legend, title=title)
    else:
        lines = ([title] if legend and title else []) + plain_table(
            headers if legend else None, rows
        )
        if lines:
            print("\n".join(lines))
    if legend and _text(summary):
        line = Text(_text(summary), style=_style(summary) if is_terminal() else "")
        console().print(line, soft_wrap=True)


def fields(rows: Sequence[tuple[str, Cell]]) -> None:
    """One item: a key and its value a line, values aligned. A value's own newlines (a persona)
    continue under the value column."""
    if is_terminal():
        _rich_table((), rows, legend=False, title="", keys=True)
    else:
        print("\n".join(plain_fields([(k, _text(v)) for k, v in rows])))


def plain_table(headers: Sequence[str] | None, rows: Sequence[Sequence[Cell]]) -> list[str]:
    """Rows as aligned columns: a cell's newlines become "; " so that a row stays one line."""
    grid = [[_flat(_text(c)) for c in row] for row in rows]
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


def _words(text: str) -> int:
    """The widest word (or header): a column narrower than this would split it."""
    return max((cell_len(w) for w in text.split()), default=0)


def _rich_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    *,
    legend: bool,
    title: str,
    keys: bool = False,
) -> None:
    """rich's table with column widths chosen here: rich would narrow a column below its widest
    word and then fold that word; here no column is narrower than its widest word, and when
    those do not fit the screen the table is wider than the screen (the terminal wraps it)."""
    texts = [[_text(c) or EMPTY for c in row] for row in rows]
    shown = [list(headers), *texts] if legend and headers else texts
    if not shown:  # no rows, and no header asked for
        return
    width = len(shown[0])
    natural = [max(cell_len(line) for row in shown for line in row[i].split("\n"))
               for i in range(width)]  # fmt: skip
    least = [max(_words(row[i]) for row in shown) for i in range(width)]
    if legend and headers:
        least = [max(n, cell_len(h)) for n, h in zip(least, headers, strict=True)]

    def build(widths: Sequence[int]) -> Table:
        grid = Table(
            box=None if keys else box.HEAVY_HEAD,
            show_header=legend and not keys,
            title=title if legend and title else None,
            title_justify="left",
        )
        for i, w in enumerate(widths):
            grid.add_column(headers[i] if headers else "", width=w, overflow="fold",
                            style="bold" if keys and i == 0 else None)  # fmt: skip
        for row, cells in zip(texts, rows, strict=True):
            grid.add_row(*(Text(t, style=_style(c)) for t, c in zip(row, cells, strict=True)))
        return grid

    screen = console().width
    probe = console(10**6)
    extra = Measurement.get(probe, probe.options, build([1] * width)).maximum - width
    widths = _fit(natural, least, screen - extra)
    console(max(screen, sum(widths) + extra)).print(build(widths))


def _fit(natural: Sequence[int], least: Sequence[int], room: int) -> list[int]:
    """Column widths: each its natural width if all fit in ``room``; else each at least its
    widest word, the space left shared in proportion to what each still wants."""
    if sum(natural) <= room:
        return list(natural)
    widths = list(least)
    spare = room - sum(widths)
    want = [max(0, n - w) for n, w in zip(natural, widths, strict=True)]
    total = sum(want)
    if spare <= 0 or total == 0:
        return widths
    for i, w in enumerate(want):
        widths[i] += w * spare // total
    return widths


def status(reply: admin_pb2.GetStatusResponse) -> None:
    fields(
        [
            ("daemon", f"ironclawd {reply.version} (pid {reply.pid}), {reply.state}"),
            ("uptime", f"{reply.uptime_seconds:.0f}s"),
            ("config", visible(reply.config_path)),
            ("you", f"uid {reply.caller.uid} ({visible(reply.caller.user_name)}), "
                    f"pid {reply.caller.pid}"),
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


def when(stamp: float) -> str:
    """A timestamp as people read it (UTC); "-" when not set."""
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%d %H:%M:%S") if stamp else EMPTY


def sessions(items: Sequence[admin_pb2.Session], *, legend: bool = True) -> None:
    rows = [[s.sid, visible(s.agent), session_state(s.state), when(s.created_at), visible(s.error)]
            for s in items]  # fmt: skip
    hint = "" if items else "no sessions (create one: ironctl session create --agent demo)"
    table(("SID", "AGENT", "STATE", "CREATED", "ERROR"), rows, legend=legend, summary=hint)


def session(s: admin_pb2.Session) -> None:
    rows: list[tuple[str, Cell]] = [
        ("sid", s.sid),
        ("agent", visible(s.agent)),
        ("state", session_state(s.state)),
        ("unit", s.unit),
        ("netns", s.netns),
        ("platform", s.platform or EMPTY),
        ("created", when(s.created_at)),
        ("updated", when(s.updated_at)),
        ("last active", when(s.last_active_at)),
    ]
    if s.error:
        rows.append(("error", visible(s.error)))
    fields(rows)


def session_state(value: int) -> str:
    return enum_name(admin_pb2.SessionState.DESCRIPTOR, value)
