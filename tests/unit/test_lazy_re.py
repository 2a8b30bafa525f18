"""ironclawd/lazy_re.py: patterns compiled at their first use answer as ``re`` does, and every
lazy pattern the package defines compiles (a typo that ``re.compile`` caught at import would
otherwise wait for its first use)."""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest

import ironclawd
from ironclawd import lazy_re

TEXTS = ("", "abc", "a1-b2", "ABC def", "x" * 300, "é", "a\nb", "--", "12:34")
PATTERNS = (r"[a-z0-9][a-z0-9-]{0,62}", r"(\w+)-(\w+)", r"\d", r"^a", r"[^\x00-\x7f]", r"b$")


@pytest.mark.parametrize("source", PATTERNS)
def test_every_method_answers_as_re_does(source: str) -> None:
    lazy, eager = lazy_re.compile(source), re.compile(source)
    assert lazy.pattern == source
    for text in TEXTS:
        for method in ("fullmatch", "match", "search"):
            got, want = getattr(lazy, method)(text), getattr(eager, method)(text)
            assert (got and got.group(0)) == (want and want.group(0)), (method, text)
        assert lazy.findall(text) == eager.findall(text)
        assert [m.span() for m in lazy.finditer(text)] == [m.span() for m in eager.finditer(text)]
        assert lazy.sub("_", text) == eager.sub("_", text)
        assert lazy.sub(lambda m: m.group(0).upper(), text, 1) == eager.sub(
            lambda m: m.group(0).upper(), text, 1
        )
        assert lazy.split(text) == eager.split(text)
        got_in, want_in = lazy.search(text, 1, 3), eager.search(text, 1, 3)
        assert (got_in and got_in.span()) == (want_in and want_in.span())
    assert lazy.flags == eager.flags
    assert lazy_re.compile(source, re.IGNORECASE).flags == re.compile(source, re.IGNORECASE).flags


def test_nothing_is_compiled_before_the_first_use() -> None:
    bad = lazy_re.compile(r"(unclosed")  # re.compile would raise here
    with pytest.raises(re.error):
        bad.fullmatch("x")
    good = lazy_re.compile(r"a+")
    assert good._compiled is None
    assert good.fullmatch("aaa") is not None
    assert good._compiled is good.compiled  # compiled once, kept


def test_every_lazy_pattern_in_the_package_compiles() -> None:
    found = 0
    for info in pkgutil.walk_packages(ironclawd.__path__, "ironclawd."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            patterns = value if isinstance(value, tuple) else (value,)
            for pattern in patterns:
                if isinstance(pattern, lazy_re.LazyPattern):
                    assert isinstance(pattern.compiled, re.Pattern), (info.name, name)
                    found += 1
    assert found >= 60, found  # ~70 in 24 modules when this was written
