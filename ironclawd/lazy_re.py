"""Regular expressions compiled at their first use, not at import.

The daemon's modules define ~70 patterns at module level. Compiled at import, they took ~6 ms
of every start (issue 17: the start is its imports), though most are used only when a change,
a package or a channel is checked. ``compile`` returns a ``LazyPattern`` with the methods of
``re.Pattern`` these modules use; the pattern is compiled by ``re`` on the first call. Two
threads racing to the first call both compile it and one result is kept: ``re`` patterns are
immutable, so either is right.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator


class LazyPattern:
    __slots__ = ("_compiled", "_flags", "pattern")

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self.pattern = pattern
        self._flags = flags
        self._compiled: re.Pattern[str] | None = None

    @property
    def compiled(self) -> re.Pattern[str]:
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = re.compile(self.pattern, self._flags)
        return compiled

    @property
    def flags(self) -> int:
        return self.compiled.flags

    def fullmatch(
        self, string: str, pos: int = 0, endpos: int = sys.maxsize
    ) -> re.Match[str] | None:
        return self.compiled.fullmatch(string, pos, endpos)

    def match(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return self.compiled.match(string, pos, endpos)

    def search(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return self.compiled.search(string, pos, endpos)

    def findall(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> list[str]:
        return self.compiled.findall(string, pos, endpos)

    def finditer(
        self, string: str, pos: int = 0, endpos: int = sys.maxsize
    ) -> Iterator[re.Match[str]]:
        return self.compiled.finditer(string, pos, endpos)

    def sub(self, repl: str | Callable[[re.Match[str]], str], string: str, count: int = 0) -> str:
        return self.compiled.sub(repl, string, count)

    def split(self, string: str, maxsplit: int = 0) -> list[str | None]:
        return self.compiled.split(string, maxsplit)

    def __repr__(self) -> str:
        return f"lazy_re.compile({self.pattern!r})"


def compile(pattern: str, flags: int = 0) -> LazyPattern:
    """``re.compile(pattern, flags)``, done at the pattern's first use."""
    return LazyPattern(pattern, flags)
