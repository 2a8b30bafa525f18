"""Keeping a rule's injected credential from the agent: where it may surface, and the checks. Pure.

The agent never holds the credential a rule injects, but an upstream that reflects what it was
sent (an echo endpoint, an error page quoting the ``Authorization`` header, a reason phrase)
hands it back, often transformed in transit. A :class:`SecretDetector` knows the credential's
*variants* (the value, and for Basic auth the decoded ``user:password`` and the password) and
finds any of them (or its core: all but two characters at either end) in bytes, in these forms:

- raw, in any letter case (an upstream that upper-cases keeps a hex token whole), and as hex;
- percent-encoded (either hex case, ``+`` for space, ``%25`` double encoding), JSON/JS-escaped
  (``\\/``, ``\\uXXXX``, ``\\xXX``, any mix per character), and the two chained;
- base64 and base64url, padded or not, of each variant, at each of the three alignments a value
  embedded mid-stream can take (the stable inner substring: the characters that depend on the
  variant's bytes alone), also when that base64 text is itself escaped as above;
- HTML entities (named, or numeric for every non-alphanumeric character), as literals;
- all of these inside a gzip, zlib, bzip2 or xz body (one level).

Escapes are undone by C-speed decoders (``escape_decode``, ``unicode_escape``) into a handful of
*views* of the data, each searched with ``bytes.find``. What costs is an escape character: a lone
``%`` or a broken ``\\x`` takes a decoder's slow path (~0.25 µs a byte, in one call that keeps
the GIL), so ``%\\`` repeated over 8 MiB took 8 s and held the daemon's event loop 2 s at a
time, even from a thread (found by a review). The egress checks therefore refuse text with more
than :data:`MAX_ESCAPES` of ``%`` and ``\\`` as one that cannot be inspected (as they refuse a
content coding): within that, a view of 8 MiB costs tens of milliseconds. What no detector can
see: a transform the upstream applies at the agent's request that we did not think of
(reversal, encryption, the value split over several answers). Credential rules belong on hosts
that do not reflect.
"""

from __future__ import annotations

import base64
import binascii
import bz2
import codecs
import html
import lzma
import re
import warnings
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import unquote_to_bytes

from ironclawd.domain.codings import refused_coding
from ironclawd.errors import PolicyDenied, ResponseRefused

MIN_SECRET = 6  # shorter variants are not searched for: they would match by chance
MIN_BASE64 = 8  # nor base64 inner substrings shorter than this
CORE_TRIM, MIN_CORE = 2, 8  # see SecretDetector
MASK = b"[REDACTED]"
# Query parameter names that carry credentials (compared lowercased, '-' read as '_'): on a rule
# that injects one, the agent has no business sending another, and an API that echoes its
# query would mirror the injected one next to it.
CREDENTIAL_PARAMS = frozenset(
    {"access_token", "refresh_token", "id_token", "token", "auth", "authorization", "api_key",
     "apikey", "key", "secret", "client_secret", "password", "passwd", "pwd", "credential",
     "credentials", "sig", "signature", "x_api_key"}
)  # fmt: skip
# Response headers dropped on a rule that injects a credential: they hand out (or echo) session
# credentials the agent has no use for, since it can never send cookies or credentials itself.
DROPPED_RESPONSE_HEADERS = frozenset(
    {"set-cookie", "set-cookie2", "authentication-info", "proxy-authentication-info",
     "proxy-authenticate"}
)  # fmt: skip
_B64URL = bytes.maketrans(b"+/", b"-_")
# Stream headers: gzip, bzip2 (block magic), xz, and zlib with each compression level's FLG.
_COMPRESSED = ((b"\x1f\x8b\x08", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"),
               *((b"\x78" + bytes([flg]), "zlib") for flg in (0x01, 0x5E, 0x9C, 0xDA)))  # fmt: skip
_TRIES = 8
_LONE_PERCENT = re.compile(rb"%(?![0-9A-Fa-f]{2})")
_TEXT_RUN = re.compile(rb"[\t\n\r\x20-\x7e]{%d,}" % MIN_SECRET)
_NOT_TEXT = re.compile(rb"[^\t\n\r\x20-\x7e]")
_WHOLE_BELOW = 64 * 1024
# The '%' and '\' a credential rule's text (request or answer, each header, each decompressed
# body) may hold: every escape in every view comes from one of them, so this bounds what the
# decoders' slow paths can be made to do (under 0.1 s a call, half a second a check, for 8 MiB).
# Text with more is refused as one that cannot be inspected.
MAX_ESCAPES = 64 * 1024


def secret_variants(credential: str, credential_format: str) -> tuple[str, ...]:
    """The values that must never reach the agent: the credential, and for a Basic format
    (``Basic {}`` with a base64 ``user:password``) also ``user:password`` and the password."""
    variants = [credential]
    if credential_format.strip().lower().startswith("basic"):
        try:
            decoded = base64.b64decode(credential, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            decoded = credential  # stored as user:password in clear (the format carries it)
        _user, sep, password = decoded.partition(":")
        variants += [decoded, password] if sep else [decoded]
    return tuple(dict.fromkeys(v for v in variants if len(v) >= MIN_SECRET))


def base64_inner(value: bytes) -> set[bytes]:
    """The base64 and base64url text that any base64 encoding containing ``value`` contains, at
    each of the three byte alignments: the characters whose 6 bits come from ``value`` alone."""
    forms = set()
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + value + b"\0\0")
        start, end = -(-8 * shift // 6), 8 * (shift + len(value)) // 6
        inner = encoded[start:end]
        if len(inner) >= MIN_BASE64:
            forms |= {inner, inner.translate(_B64URL)}
    return forms


def _views(data: bytes) -> Iterator[tuple[str, bytes]]:
    """``data`` (its text runs: :func:`_text_runs`) as the agent could read it after undoing
    transit escapes, one view per decoder chain (each view a single C-speed pass)."""
    bases = [("", data)]
    if b"%" in data:
        pct = _percent_decoded(data)
        yield "percent-encoded", pct
        bases.append(("percent-encoded, ", pct))
        if b"%" in pct:
            yield "percent-encoded twice", _percent_decoded(pct)
        if b"+" in data:
            yield "form-encoded", _percent_decoded(data.replace(b"+", b" "))
    for prefix, base in bases:
        if b"\\" in base:
            for label, js in _json_decodings(base):
                yield prefix + label, js
                if not prefix and b"%" in js:
                    yield f"{label}, percent-encoded", _percent_decoded(js)


def _json_decodings(data: bytes) -> Iterator[tuple[str, bytes]]:
    yield "JSON-escaped", _json_unescaped(data)
    # Python's codec also reads octal (\0), \N{...}, \a, \v, which JSON does not: a lone
    # backslash before the credential would swallow its first characters. This view undoes only
    # \uXXXX, \xXX and \/, and leaves every other backslash alone.
    minimal = data.replace(b"\\/", b"/").replace(b"\\x", b"\\u00")
    yield (
        "JSON \\u-escaped",
        minimal.decode("raw_unicode_escape", "replace").encode("latin-1", "replace"),
    )
    if b"\\\\" in data:  # "\\\\x41" is "\\\\" "x41" to JSON, but the agent may read "\\x41"
        yield "JSON-escaped, backslashes collapsed", _json_unescaped(data.replace(b"\\\\", b"\\"))


def _text_runs(data: bytes) -> bytes:
    """The ASCII text runs of ``data`` long enough to hold an escaped form, NUL-separated: every
    escaped form is such a run, and binary (an image, an archive) is mostly not, so decoders
    have little to do there. Small bodies are used whole."""
    if len(data) <= _WHOLE_BELOW:
        return data
    # In slices of about _WHOLE_BELOW, each cut at a byte that no run holds: findall over 8 MiB
    # of short runs ("abcdef\0" repeated) was one call of 0.3 s, keeping the GIL.
    runs: list[bytes] = []
    start = 0
    while start < len(data):
        cut = _NOT_TEXT.search(data, start + _WHOLE_BELOW)
        end = cut.start() if cut is not None else len(data)
        runs += _TEXT_RUN.findall(data, start, end)
        start = end + 1
    return b"\0".join(runs)


def _percent_decoded(data: bytes) -> bytes:
    # %XX becomes \xXX for escape_decode, which undoes it in C (existing backslashes doubled,
    # a '%' that starts no escape spelt %25 first, so it stays a '%').
    prepared = _LONE_PERCENT.sub(b"%25", data.replace(b"\\", b"\\\\"))
    prepared = prepared.replace(b"%", b"\\x")
    return codecs.escape_decode(prepared, "replace")[0]


def _json_unescaped(data: bytes) -> bytes:
    with warnings.catch_warnings():  # "\q" and the like are kept, with a DeprecationWarning
        warnings.simplefilter("ignore", DeprecationWarning)
        text = data.replace(b"\\/", b"/").decode("unicode_escape", "replace")
    return text.encode("latin-1", "replace")


def _decompressed(data: bytes, limit: int) -> Iterator[tuple[str, bytes]]:
    """Bodies inside compressed streams that start anywhere in ``data`` (one level, a few tries
    per kind), ``limit`` decompressed bytes in all: a response could embed one mid-body."""
    budget = limit
    view = memoryview(data)  # no copy per try
    for magic, name in _COMPRESSED:
        at = data.find(magic)
        for _ in range(_TRIES):
            if at < 0 or budget <= 0:
                break
            inner = _decompress(name, view[at:], budget)
            if inner:
                budget -= len(inner)
                yield name, inner
            at = data.find(magic, at + 1)


def _decompress(name: str, data: memoryview, limit: int) -> bytes:
    try:
        if name == "gzip":
            return zlib.decompressobj(wbits=31).decompress(data, limit)
        if name == "zlib":
            return zlib.decompressobj().decompress(data, limit)
        if name == "bzip2":
            return bz2.BZ2Decompressor().decompress(data, limit)
        return lzma.LZMADecompressor().decompress(data, limit)
    except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError):
        return b""


@dataclass(frozen=True)
class Finding:
    """Where a variant of the credential was found (never the value itself)."""

    form: str  # e.g. "base64url in the JSON-escaped view"
    # False: not a form of the credential, but text with more escapes than can be inspected
    # (MAX_ESCAPES): it is refused all the same, worded so.
    inspected: bool = True

    def __str__(self) -> str:
        return self.form

    def says(self, credential: str) -> str:
        """What the checked text does, for a refusal: carries ``credential``, or cannot be
        inspected for it."""
        if self.inspected:
            return f"carries {credential} ({self.form})"
        return f"cannot be inspected for {credential} ({self.form})"


class SecretDetector:
    """Finds the credential's variants in any of the forms listed in the module docstring."""

    def __init__(self, variants: Iterable[str]) -> None:
        raw = [v.encode() for v in variants if len(v) >= MIN_SECRET]
        # What is searched for is each variant's core, without CORE_TRIM bytes at either end
        # when it stays long enough: missing two characters, the value is as good as leaked
        # (and a neighbouring escape may swallow an edge character in one of the views).
        core = [v[CORE_TRIM:-CORE_TRIM] if len(v) >= MIN_CORE + 2 * CORE_TRIM else v for v in raw]
        # Searched in every view, lowercased: the text and its hex; HTML entity forms (named,
        # and numeric for every non-alphanumeric byte) only in the raw view, as literals.
        self._folded = {v.hex().encode(): "hex" for v in core} | {v.lower(): "text" for v in core}
        self._html = sorted({f.lower() for v in core for f in _html_forms(v)} - set(core))
        self._base64 = sorted(set().union(*(base64_inner(v) for v in core)) if core else set())
        self._literal = sorted(
            {*raw, *(v.replace(b"/", b"\\/") for v in raw), *self._base64,
             *(_percent_encode(v, upper) for v in raw for upper in (True, False))},
            key=len, reverse=True,
        )  # fmt: skip

    def __bool__(self) -> bool:
        return bool(self._folded)

    @property
    def tail(self) -> int:
        """Bytes a fragment of some form could span, escaped (at most 10 bytes per byte)."""
        return 10 * max((len(f) for f in self._literal), default=0)

    def find(self, data: bytes, decompress_limit: int = 0, max_escapes: int = 0) -> Finding | None:
        """The first form of the credential in ``data``, or None. ``decompress_limit`` > 0 also
        looks inside a compressed body (up to that many decompressed bytes). ``max_escapes``
        > 0: text (or a decompressed body) with more ``%`` and ``\\`` than that is not decoded;
        a Finding with ``inspected`` False says so."""
        if not self:
            return None
        found = self._find_in_views(data, max_escapes)
        if found is None and decompress_limit > 0:
            for name, inner in _decompressed(data, decompress_limit):
                deeper = self._find_in_views(inner, max_escapes)
                if deeper is not None:
                    return Finding(f"{deeper.form}, inside {name}", deeper.inspected)
        return found

    def _find_in_views(self, data: bytes, max_escapes: int) -> Finding | None:
        found = self._find_in_view("raw", data)
        if found is not None:
            return found
        text = _text_runs(data)
        escapes = text.count(b"%") + text.count(b"\\") if max_escapes else 0
        if escapes > max_escapes:
            return Finding(
                f"{escapes} '%' and '\\' in its text, more than the {max_escapes} that can be "
                "inspected",
                inspected=False,
            )
        for view_name, view in _views(text):
            found = self._find_in_view(view_name, view)
            if found is not None:
                return found
        return None

    def _find_in_view(self, view_name: str, view: bytes) -> Finding | None:
        folded = view.lower()
        for form, kind in self._folded.items():
            if form in folded:
                return Finding(f"{kind} ({view_name})")
        for form in self._base64:
            if form in view:
                kind = "base64url" if b"-" in form or b"_" in form else "base64"
                return Finding(f"{kind} ({view_name})")
        if view_name == "raw":
            for form in self._html:
                if form in folded:
                    return Finding("text (HTML-escaped)")
        return None

    def mask(self, data: bytes) -> bytes:
        """Defence in depth after :meth:`find`: replace the exact literal forms (raw, ``\\/``,
        percent-encoded, base64 inner) with a mark."""
        for form in self._literal:
            data = data.replace(form, MASK)
        return data

    def mask_text(self, text: str) -> str:
        return self.mask(text.encode("latin-1", "replace")).decode("latin-1")


def _percent_encode(value: bytes, upper: bool) -> bytes:
    unreserved = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"
    spec = "%{:02X}" if upper else "%{:02x}"
    return b"".join(bytes([b]) if b in unreserved else spec.format(b).encode() for b in value)


def _html_forms(value: bytes) -> set[bytes]:
    text = value.decode("utf-8", "replace")
    named = html.escape(text).encode()
    decimal = "".join(c if c.isalnum() else f"&#{ord(c)};" for c in text).encode()
    hexa = "".join(c if c.isalnum() else f"&#x{ord(c):x};" for c in text).encode()
    return {named, decimal, hexa}


def credential_params(query: str) -> list[str]:
    """The names of credential-shaped query parameters (see CREDENTIAL_PARAMS), as sent."""
    names = []
    for part in re.split(r"[&;]", query):
        raw_name = part.split("=", 1)[0]
        name = unquote_to_bytes(raw_name.replace("+", " ")).decode("latin-1").strip().lower()
        # PHP-style and dotted names nest: auth[token], user.password.
        pieces = {name, *re.split(r"[\[\].]+", name)}
        if any(piece.replace("-", "_") in CREDENTIAL_PARAMS for piece in pieces):
            names.append(raw_name)
    return names


def standard_reason(status: int) -> str:
    """The reason phrase the agent sees: the standard one for the code, never the upstream's
    (it is free text an upstream may fill with anything it was sent)."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def check_request(
    detector: SecretDetector,
    path: str,
    query: str,
    headers: Iterable[tuple[str, str]],
    body: bytes,
) -> None:
    """On a rule that injects a credential: PolicyDenied for credential-shaped query parameters
    and for the credential itself (any form) in the path, query, a header or the body. The agent
    never had it; if it sends it, it learnt it by a reflection this broker missed."""
    names = credential_params(query)
    if names:
        raise PolicyDenied(
            f"egress: query parameter {', '.join(dict.fromkeys(names))} looks like a credential; "
            "refused on a rule that injects one (the broker adds the credential itself)"
        )
    parts = [("path", path.encode()), ("query", query.encode()), ("body", body)]
    for name, value in headers:
        hidden = detector.find(name.encode("latin-1", "replace"), max_escapes=MAX_ESCAPES)
        named = "a header name" if hidden else name
        parts.append((f"header {named}", f"{name}: {value}".encode("utf-8", "replace")))
    for where, data in parts:
        found = detector.find(data, max_escapes=MAX_ESCAPES)
        if found is not None:
            says = found.says("the rule's credential")
            raise PolicyDenied(f"egress: the request's {where} {says}; refused")


MAX_RESPONSE_HEADERS = 256


def checked_head(
    status: int, headers: Iterable[tuple[str, str]], detector: SecretDetector
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The reason phrase and headers the agent may see. ResponseRefused for a content coding
    other than identity, or (on a credential rule) a header carrying the credential; such a rule
    also loses the headers of DROPPED_RESPONSE_HEADERS, and the rest is masked besides."""
    headers = tuple(headers)
    if len(headers) > MAX_RESPONSE_HEADERS:
        # Each is checked for the credential on the event loop: 16,000 tiny ones (within the
        # HTTP parser's 100 KiB) held it 0.6 s per answer (found by a review).
        raise ResponseRefused(
            f"egress: response refused: {len(headers)} headers, more than the "
            f"{MAX_RESPONSE_HEADERS} an answer may carry"
        )
    shown = refused_coding(headers)
    if shown is not None:
        raise ResponseRefused(
            f"egress: response refused: Content-Encoding {shown} cannot be inspected (the broker "
            "asked for identity)"
        )
    reason = standard_reason(status)
    if not detector:
        return reason, headers
    kept = []
    for index, (name, value) in enumerate(headers):
        if name.lower() in DROPPED_RESPONSE_HEADERS:
            continue
        found = detector.find(f"{name}: {value}".encode("latin-1", "replace"), 0, MAX_ESCAPES)
        if found is not None:
            hidden = detector.find(name.encode("latin-1", "replace"), 0, MAX_ESCAPES)
            named = f"#{index + 1}" if hidden else name
            raise ResponseRefused(
                f"egress: response refused: header {named} {found.says('the injected credential')}"
            )
        kept.append((detector.mask_text(name), detector.mask_text(value)))
    return reason, tuple(kept)


def checked_body(body: bytes, truncated: bool, detector: SecretDetector, limit: int) -> bytes:
    """The body the agent may see (a credential rule's, read whole): ResponseRefused if it
    carries the credential in any form; masked besides. A body cut at the cap also loses its
    last ``detector.tail`` bytes: a credential cut in half there would pass unrecognised."""
    found = detector.find(body, decompress_limit=limit, max_escapes=MAX_ESCAPES)
    if found is not None:
        raise ResponseRefused(
            f"egress: response refused: the body {found.says('the injected credential')}"
        )
    if truncated:
        body = body[: max(0, len(body) - detector.tail)]
    return detector.mask(body)
