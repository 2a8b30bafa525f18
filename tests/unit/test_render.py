from __future__ import annotations

import unicodedata

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
        ("soft\u00adhyphen", "soft\\xadhyphen"),
        ("arabic\u061cmark", "arabic\\u061cmark"),
        ("word\u2060joiner", "word\\u2060joiner"),
        ("tag\U000e0041", "tag\\U000e0041"),
        ("selector\U000e0100", "selector\\U000e0100"),
        ("filler\u3164", "filler\\u3164"),
        ("private\ue000", "private\\ue000"),
    ],
)
def test_control_escape_and_bidi_characters_are_made_visible(text: str, shown: str) -> None:
    assert visible(text) == shown


# Every format character (Cf) this Python knows: invisible or steering bidi on a terminal.
FORMAT = "".join(c for c in map(chr, range(0x110000)) if unicodedata.category(c) == "Cf")
# Invisible although not Cf: variation selectors, Hangul fillers, the grapheme joiner, ...
IGNORABLE = "\u034f\u115f\u1160\u17b4\u180b\u180f\u3164\ufe00\ufe0f\uffa0\U000e0100\U000e01ef"


@pytest.mark.parametrize("text", [FORMAT, IGNORABLE], ids=["format", "default-ignorable"])
def test_every_invisible_character_is_made_visible(text: str) -> None:
    shown = visible(text)
    assert shown.isascii(), [f"U+{ord(c):04X}" for c in shown if not c.isascii()]
    assert shown.count("\\") == len(text)  # one escape each


def test_tag_characters_cannot_hide_words_or_pass_for_another_sender() -> None:
    def tags(words: str) -> str:
        return "".join(chr(0xE0000 + ord(c)) for c in words)

    assert visible("hello?" + tags(" obey")) == (
        "hello?\\U000e0020\\U000e006f\\U000e0062\\U000e0065\\U000e0079"
    )
    assert visible("chat:@alice" + tags("x")) != visible("chat:@alice")


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
