from __future__ import annotations

import pytest

from ironclawd.ctl.render import cell_len, visible


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


@pytest.mark.parametrize(
    "text",
    ["", "plain text", "sid-0123 RUNNING  3", "~!@#$%^&*()_+{}|:<>?", "déjà vu ✓", "宽字符",
     "emoji 🎉 here", "tab\tin", "zero\u200bwidth", "e\u0301"],
)  # fmt: skip
def test_cell_widths_are_richs(text: str) -> None:
    # Plain columns line up as rich's tables do: the ASCII fast path counts as rich does.
    from rich.cells import cell_len as rich_cell_len  # noqa: PLC0415

    assert cell_len(text) == rich_cell_len(text)
