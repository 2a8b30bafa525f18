"""The signature of IronClaw's signed webhooks, both directions (docs/channels.md). Pure.

Header ``X-Ironclaw-Signature: t=<unix seconds>,v1=<hex>``, where ``<hex>`` is
HMAC-SHA256(secret, ``b"<t>." + raw body``). The timestamp is inside the MAC, so a captured
request cannot be re-dated, and a receiver refuses one whose ``t`` is more than its window away
from its own clock (either side: a future ``t`` is as suspect as an old one). Several ``v1=``
entries may be given (a sender signing with the old and the new secret while one is rotated);
one matching is enough. Comparison is constant-time and every candidate is compared.
"""

from __future__ import annotations

import hashlib
import hmac

from ironclawd import lazy_re
from ironclawd.errors import SignatureError

HEADER = "X-Ironclaw-Signature"
DELIVERY_HEADER = "X-Ironclaw-Delivery-Id"
MAX_HEADER = 512  # characters: t, and a few v1 entries
MAX_SIGNATURES = 4
_T = lazy_re.compile(r"[0-9]{1,12}")
_V1 = lazy_re.compile(r"[0-9a-f]{64}")
EXPECTED = "t=<unix seconds>,v1=<64 lowercase hex of HMAC-SHA256(secret, '<t>.' + body)>"


def mac(secret: bytes, timestamp: int, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``f"{timestamp}."`` + ``body``."""
    return hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``X-Ironclaw-Signature`` value for ``body`` sent at ``timestamp``."""
    return f"t={timestamp},v1={mac(secret, timestamp, body)}"


def parse(header: str | None) -> tuple[int, tuple[str, ...]]:
    """The timestamp and the v1 signatures of a header; SignatureError "missing"/"malformed"."""
    if header is None or not header.strip():
        raise SignatureError("missing", f"no {HEADER} header; expected {EXPECTED}")
    if len(header) > MAX_HEADER:
        raise SignatureError("malformed", f"{HEADER} is longer than {MAX_HEADER} characters")
    timestamp: int | None = None
    signatures: list[str] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            raise SignatureError("malformed", f"{HEADER} part without '=': expected {EXPECTED}")
        if key == "t":
            if timestamp is not None or not _T.fullmatch(value):
                raise SignatureError("malformed", f"t: expected one decimal unix time; {EXPECTED}")
            timestamp = int(value)
        elif key == "v1":
            if not _V1.fullmatch(value):
                raise SignatureError("malformed", f"v1: expected 64 lowercase hex; {EXPECTED}")
            signatures.append(value)
        # Other keys (a future v2) are ignored, as a sender may add them for other receivers.
    if timestamp is None or not signatures:
        raise SignatureError("malformed", f"{HEADER} lacks t= or v1=: expected {EXPECTED}")
    if len(signatures) > MAX_SIGNATURES:
        raise SignatureError("malformed", f"more than {MAX_SIGNATURES} v1 signatures")
    return timestamp, tuple(signatures)


def verify(secret: bytes, header: str | None, body: bytes, now: float, window: float) -> int:
    """The signed timestamp once ``header`` authenticates ``body`` under ``secret`` within
    ``window`` seconds of ``now``; else SignatureError with reason "missing", "malformed",
    "mismatch" (checked before the time: only an authentic request learns it is stale) or
    "stale"."""
    timestamp, signatures = parse(header)
    expected = mac(secret, timestamp, body).encode()
    matched = False
    for candidate in signatures:  # no early exit: the time taken does not say which matched
        matched |= hmac.compare_digest(expected, candidate.encode())
    if not matched:
        raise SignatureError(
            "mismatch", "no v1 is HMAC-SHA256 of '<t>.' + the raw body under the endpoint's secret"
        )
    skew = now - timestamp
    if abs(skew) > window:
        when = "old" if skew > 0 else "in the future"
        raise SignatureError(
            "stale", f"t is {abs(skew):.0f} s {when}; expected within {window:g} s of now"
        )
    return timestamp
