"""ironctl's output on a terminal: rich tables and styled lines (ctl/render.py decides; off a
terminal nothing here is imported, nor rich's console: ``ironctl status | cat`` stays fast)."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ironclawd.ctl.render import EMPTY, Cell, cell_style, cell_text, is_terminal


def console(width: int | None = None) -> Console:
    # rich already honours NO_COLOR; colour is further limited to a real terminal.
    colour = is_terminal() and "NO_COLOR" not in os.environ
    # Whatever reaches a console is shown as written: no markup, and no :emoji_codes: turned
    # into pictures (rich.markup.escape stops tags, not those: ":one::zero::zero:" was a 100
    # drawn in keycaps in the diff an approver read). Styles come only from Text objects.
    return _Console(no_color=not colour, highlight=False, markup=False, emoji=False,
                    soft_wrap=False, width=width)  # fmt: skip


class _Console(Console):
    """rich's Console, but a closed pipe is left to ironctl's main() (exit 141, as for every
    other write), not turned into a silent exit 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "standard output closed")


def line(cell: Cell) -> None:
    """One styled line (a table's summary), never wrapped."""
    console().print(Text(cell_text(cell), style=cell_style(cell)), soft_wrap=True)


def _words(text: str) -> int:
    """The widest word (or header): a column narrower than this would split it."""
    return max((cell_len(w) for w in text.split()), default=0)


def rich_table(
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
    texts = [[cell_text(c) or EMPTY for c in row] for row in rows]
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
            grid.add_row(*(Text(t, style=cell_style(c)) for t, c in zip(row, cells, strict=True)))
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
