"""Text from outside (the daemon, the host, a user) made safe to print: standard library only,
so that argument checking (ctl/argtypes.py) and error reports need nothing of rich."""

from __future__ import annotations


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
