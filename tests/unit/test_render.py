from __future__ import annotations

import pytest

from ironclawd.ctl.render import visible


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text", "plain text"),
        ("tab\tkept", "tab\tkept"),
        ("bell\a", "bell\\x07"),
        ("esc\x1b[31mred", "esc\\x1b[31mred"),
        ("rtl\u202eevil", "rtl\\u202eevil"),
        ("isolate\u2066x\u2069", "isolate\\u2066x\\u2069"),
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("bom\ufeff", "bom\\ufeff"),
        ("c1\x9b", "c1\\x9b"),
        ("byte\udcff", "byte\\xff"),
        ("lone\ud800", "lone\\ud800"),
        ("line\u2028sep", "line\\u2028sep"),
        ("déjà vu ✓", "déjà vu ✓"),
    ],
)
def test_control_escape_and_bidi_characters_are_made_visible(text: str, shown: str) -> None:
    assert visible(text) == shown


def test_newlines_only_when_asked() -> None:
    assert visible("a\nb") == "a\\x0ab"
    assert visible("a\nb", newlines=True) == "a\nb"
