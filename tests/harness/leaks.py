"""Does a secret show in these bytes, in any encoding it may take in transit? For tests only.

Deliberately independent of ironclawd/domain/egress_secrets.py (which the tests check): this
side *decodes* what it is given (urllib's unquote, a regex JSON unescape, ``html.unescape``,
every base64/base64url run at every start offset, gzip/zlib/bzip2/xz) and searches the results
for the secret in any letter case and as hex. Slow, thorough, test-sized inputs only.
"""

from __future__ import annotations

import base64
import binascii
import bz2
import html
import lzma
import re
import zlib
from collections.abc import Iterable, Iterator
from urllib.parse import unquote_to_bytes

_JSON_ESCAPE = re.compile(rb"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})|\\(.)", re.DOTALL)
_B64_RUN = re.compile(rb"[A-Za-z0-9+/=_-]{8,}")


def _json_unescape(data: bytes) -> bytes:
    def one(m: re.Match[bytes]) -> bytes:
        code = m[1] or m[2]
        if code:
            return chr(int(code, 16)).encode("utf-8")
        return m[3]

    return _JSON_ESCAPE.sub(one, data)


def _unescaped(data: bytes, depth: int = 2) -> Iterator[bytes]:
    yield data
    if depth == 0:
        return
    for decoded in (
        unquote_to_bytes(data),
        unquote_to_bytes(data.replace(b"+", b" ")),
        _json_unescape(data),
        html.unescape(data.decode("latin-1")).encode("latin-1", "replace"),
    ):
        if decoded != data:
            yield from _unescaped(decoded, depth - 1)


def _base64_decodings(data: bytes) -> Iterator[bytes]:
    for run in _B64_RUN.findall(data):
        for start in range(4):
            piece = run[start:].rstrip(b"=")
            piece = piece[: len(piece) - 1] if len(piece) % 4 == 1 else piece
            piece += b"=" * (-len(piece) % 4)
            for alphabet in (b"+/", b"-_"):
                try:
                    yield base64.b64decode(piece, altchars=alphabet, validate=True)
                except (binascii.Error, ValueError):
                    continue


def _decompressed(data: bytes) -> Iterator[bytes]:
    """What decompresses from any offset that could start a gzip, zlib, bzip2 or xz stream."""
    makers = (lambda: zlib.decompressobj(47), bz2.BZ2Decompressor, lzma.LZMADecompressor)
    for offset, byte in enumerate(data):
        if byte not in (0x1F, 0x78, 0x42, 0xFD):
            continue
        for make in makers:
            try:
                inner = make().decompress(data[offset:])
            except Exception:  # not that container
                continue
            if inner:
                yield inner


def find_leaks(data: bytes | str, secrets: Iterable[str], *, _depth: int = 1) -> list[str]:
    """Descriptions of each way a secret is visible in ``data`` (empty when none is)."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    found = []
    needles = [(s, s.encode().lower(), s.encode().hex().encode()) for s in secrets]
    for view in _unescaped(data):
        candidates = [("text", view.lower()), *(("base64", d.lower())
                                               for d in _base64_decodings(view))]  # fmt: skip
        for kind, candidate in candidates:
            for secret, lowered, hexed in needles:
                if lowered in candidate or hexed in candidate:
                    found.append(f"{secret[:6]}… as {kind} in {view[:40]!r}")
    if _depth > 0:
        for inner in _decompressed(data):
            found += [f"compressed: {f}" for f in find_leaks(inner, secrets, _depth=_depth - 1)]
    return sorted(set(found))
