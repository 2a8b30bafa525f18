"""What the signed-webhook listener (host/webhook.py) decides without I/O: its listen address,
the JSON envelope of a message, and rate and replay bookkeeping (time from the caller's
monotonic clock)."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ironclawd.errors import InvalidArgument

MAX_REPLAY_KEYS = 100_000
MAX_ID = 128
FIELDS = ("event_id", "text", "thread")
ENVELOPE = '{"event_id": "<1-128 printable ASCII>", "text": "<non-empty>", "thread": "<optional>"}'


@dataclass(frozen=True)
class Listen:
    """A parsed ``listen``: a Unix socket path, or a TCP host and port."""

    path: str = ""
    host: str = ""
    port: int = 0

    def __str__(self) -> str:
        if self.path:
            return f"unix:{self.path}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str) -> Listen:
    """``"127.0.0.1:8787"``, ``"[::1]:8787"`` or ``"unix:/abs/path"``; InvalidArgument else."""
    expected = 'expected "HOST:PORT", "[V6]:PORT" or "unix:/absolute/path"'
    if text.startswith("unix:"):
        path = text[5:]
        if not path.startswith("/") or "\0" in path or len(path.encode()) > 107:
            raise InvalidArgument(f"listen {text!r}: {expected} (a path of at most 107 bytes)")
        return Listen(path=path)
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidArgument(f"listen {text!r}: {expected}")
    return Listen(host=host, port=int(port))


@dataclass(frozen=True)
class Envelope:
    event_id: str
    text: str
    thread: str


def parse_envelope(body: bytes) -> Envelope:
    """The message in a request body; InvalidArgument naming the field and what was expected.
    Text is taken as it is (control and bidi characters included: the queue keeps them, and
    operators see them escaped); only a lone surrogate, which is no text at all, is refused."""
    try:
        raw = json.loads(body.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidArgument(f"body is not UTF-8 JSON ({str(exc)[:120]})") from None
    if not isinstance(raw, dict):
        raise InvalidArgument("body is not a JSON object")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise InvalidArgument(f"unknown field(s): {', '.join(k[:40] for k in unknown[:5])}")
    event_id, text, thread = raw.get("event_id"), raw.get("text"), raw.get("thread", "")
    if not isinstance(event_id, str) or not _printable_id(event_id) or not event_id:
        raise InvalidArgument(f"event_id is missing or not 1-{MAX_ID} printable ASCII")
    if not isinstance(thread, str) or not _printable_id(thread):
        raise InvalidArgument(f"thread is not 0-{MAX_ID} printable ASCII")
    if not isinstance(text, str) or not text:
        raise InvalidArgument("text is missing or not a non-empty string")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("text holds a lone surrogate (\\ud800-\\udfff)") from None
    return Envelope(event_id, text, thread)


def _printable_id(value: str) -> bool:
    return len(value) <= MAX_ID and all("!" <= c <= "~" for c in value)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object with a repeated key is refused: which copy counts would be a guess."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"repeated key {key[:40]!r}")
        seen[key] = value
    return seen


class TokenBucket:
    """``per_minute`` messages a minute, in a burst of up to that many."""

    def __init__(self, now: Callable[[], float], per_minute: int) -> None:
        self._now = now
        self._capacity = float(max(1, per_minute))
        self._rate = max(1, per_minute) / 60.0
        self._tokens = self._capacity
        self._at = now()

    def _refill(self) -> None:
        now = self._now()
        self._tokens = min(self._capacity, self._tokens + (now - self._at) * self._rate)
        self._at = now

    def wait(self) -> float:
        """Seconds until one token is there (0 if one is there now)."""
        self._refill()
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self._rate

    def take(self) -> None:
        self._refill()
        self._tokens -= 1


class ReplayCache:
    """Keys seen within ``2 * window`` seconds (a signature is valid from ``t - window`` to
    ``t + window``, and was at most ``window`` old when first seen); bounded, oldest first out."""

    def __init__(self, now: Callable[[], float], window: float) -> None:
        self._now = now
        self._keep = 2 * window
        self._seen: OrderedDict[str, float] = OrderedDict()

    def _expire(self) -> None:
        now = self._now()
        while self._seen:
            key, until = next(iter(self._seen.items()))
            if until > now and len(self._seen) <= MAX_REPLAY_KEYS:
                break
            del self._seen[key]

    def __contains__(self, key: str) -> bool:
        self._expire()
        return key in self._seen

    def add(self, key: str) -> None:
        self._seen[key] = self._now() + self._keep
        self._seen.move_to_end(key)
        self._expire()

    def discard(self, key: str) -> None:
        self._seen.pop(key, None)
