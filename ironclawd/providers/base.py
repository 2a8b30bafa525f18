"""What every provider implements, and the SSE reading they share."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from ironclawd.domain.codings import IDENTITY, refused_coding
from ironclawd.errors import ProviderError
from ironclawd.ports import Provider

if TYPE_CHECKING:  # httpx loads at the first model call (issue 17: not at start)
    import httpx

__all__ = ["IDENTITY", "Provider", "answer_cap", "raise_for_status", "sse_events"]


# What each adapter module exports as ``build`` (ironclawd/providers/registry.py calls it).
ProviderFactory = Callable[["httpx.AsyncClient"], Provider]


# What one model call may read from its upstream. httpx's ``aiter_lines`` buffers a line until
# its newline, however long, and nothing else bounded the answer: a broken or hostile upstream
# could stream until the call's time ran out (600 s), all of it held in the daemon. A line is
# one event; a real answer is about 4 bytes a token, with each event's JSON around it.
MAX_LINE_BYTES = 1 << 20
ANSWER_BASE_BYTES = 1 << 20
ANSWER_BYTES_PER_TOKEN = 1024


def answer_cap(max_tokens: int) -> int:
    """The most bytes of event stream a call of ``max_tokens`` output tokens may read."""
    return ANSWER_BASE_BYTES + max_tokens * ANSWER_BYTES_PER_TOKEN


async def sse_events(response: httpx.Response, max_bytes: int) -> AsyncIterator[dict[str, Any]]:
    """JSON payloads of a text/event-stream response (``data:`` lines; ``[DONE]`` ends it).
    A line over MAX_LINE_BYTES, or more than ``max_bytes`` in all, is an upstream error."""
    async for line in _lines(response, max_bytes):
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if not data:
            continue
        if data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except json.JSONDecodeError as exc:
            raise ProviderError(f"upstream sent a malformed event: {exc}") from exc
        if isinstance(event, dict):
            yield event


async def _lines(response: httpx.Response, max_bytes: int) -> AsyncIterator[str]:
    """The body's lines (split at LF, a CR before it dropped), each checked against
    MAX_LINE_BYTES as it grows and the whole against ``max_bytes`` as it arrives."""
    pending = bytearray()
    total = 0
    async for part in response.aiter_bytes():
        total += len(part)
        if total > max_bytes:
            raise ProviderError(
                f"upstream sent more than {max_bytes} bytes for one answer (the cap: "
                f"{ANSWER_BASE_BYTES} + {ANSWER_BYTES_PER_TOKEN} a token of max_tokens)"
            )
        start = len(pending)  # the bytes before it held no newline: search only the new ones
        pending += part
        cut = 0
        while (end := pending.find(b"\n", max(start, cut))) >= 0:
            yield _line(pending, cut, end)
            cut = end + 1
        del pending[:cut]
        if len(pending) > MAX_LINE_BYTES + 1:  # one more: a CR that will not count
            raise _line_too_long()
    if pending:
        yield _line(pending, 0, len(pending))


def _line(buffer: bytearray, start: int, end: int) -> str:
    if end > start and buffer[end - 1] == 0x0D:
        end -= 1
    if end - start > MAX_LINE_BYTES:
        raise _line_too_long()
    return buffer[start:end].decode("utf-8", "replace")


def _line_too_long() -> ProviderError:
    return ProviderError(f"upstream sent an event line over {MAX_LINE_BYTES} bytes (the cap)")


# How much of an error body to keep. The proxy clips the message after redacting it: a secret
# echoed across a cut made here would survive as a prefix that no longer matches it.
MAX_ERROR_BODY = 64 * 1024


# Every adapter asks for bodies as sent (IDENTITY): the caps here count what httpx hands over,
# and with gzip it unpacked each chunk from the network whole first (a 260 KB error body became
# 64 MiB; found by a review). An answer in another coding is refused.


async def raise_for_status(response: httpx.Response, provider: str) -> None:
    coding = refused_coding(response.headers.multi_items())
    if coding is not None:
        await response.aclose()
        raise ProviderError(
            f"{provider}: upstream answered in Content-Encoding {coding}, though the proxy "
            "asked for identity"
        )
    if response.status_code >= 400:
        data = b""
        async for part in response.aiter_bytes():
            data += part
            if len(data) >= MAX_ERROR_BODY:
                break
        body = data[:MAX_ERROR_BODY].decode("utf-8", "replace")
        raise ProviderError(f"{provider}: upstream answered HTTP {response.status_code}: {body}")
