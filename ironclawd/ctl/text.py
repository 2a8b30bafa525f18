"""Text from outside (the daemon, the host, a user) made safe to print: standard library only,
so that argument checking (ctl/argtypes.py) and error reports need nothing of rich."""

from __future__ import annotations

# Escaped by Unicode category: controls (Cc), format characters (Cf: bidi marks, embeddings and
# isolates, zero-width characters, the soft hyphen, invisible operators, the tag characters
# U+E0000-E007F that spell ASCII no terminal draws but a model reads), surrogates (Cs), private
# use (Co: what a font draws there is anyone's guess), unassigned code points (Cn: a newer
# Unicode's invisible character is unassigned to this Python), line and paragraph separators.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
# Default-ignorable code points (Unicode's DerivedCoreProperties.txt) of other categories: drawn
# as nothing, yet text to a model. Variation selectors can carry a byte each after an emoji;
# Hangul fillers make a blank name; also the combining grapheme joiner, Khmer's inherent vowels
# and Mongolian's free variation selectors. (An emoji's U+FE0F is shown as an escape too.)
_INVISIBLE = (
    (0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xE0100, 0xE01EF),
)  # fmt: skip


def visible(text: str, *, newlines: bool = False) -> str:
    """Make control, escape, bidi and invisible characters visible as escapes, so that text
    from outside cannot restyle the terminal, reorder what the operator reads or hide words
    from them. Lone surrogates (bytes that were not UTF-8, kept by surrogateescape) show as the
    byte they stand for, and never fail to print."""
    if text.isascii() and text.isprintable():  # most cells: nothing to look at one by one
        return text
    from unicodedata import category  # noqa: PLC0415 (only for text that needs it)

    out = []
    for ch in text:
        code = ord(ch)
        if 0x20 <= code < 0x7F or ch == "\t" or (newlines and ch == "\n"):
            out.append(ch)
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x80 or category(ch) in _ESCAPED_CATEGORIES or _is_invisible(code):
            out.append(_escape(code))
        else:
            out.append(ch)
    return "".join(out)


def _is_invisible(code: int) -> bool:
    return any(low <= code <= high for low, high in _INVISIBLE)


def _escape(code: int) -> str:
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
