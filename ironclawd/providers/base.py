"""What every provider implements, and the SSE reading they share."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from ironclawd.errors import ProviderError
from ironclawd.ports import Provider

if TYPE_CHECKING:  # httpx loads at the first model call (issue 17: not at start)
    import httpx

__all__ = ["Provider", "raise_for_status", "sse_events"]


# What each adapter module exports as ``build`` (ironclawd/providers/registry.py calls it).
ProviderFactory = Callable[["httpx.AsyncClient"], Provider]


async def sse_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """JSON payloads of a text/event-stream response (``data:`` lines; ``[DONE]`` ends it)."""
    async for line in response.aiter_lines():
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


# How much of an error body to keep. The proxy clips the message after redacting it: a secret
# echoed across a cut made here would survive as a prefix that no longer matches it.
MAX_ERROR_BODY = 64 * 1024


async def raise_for_status(response: httpx.Response, provider: str) -> None:
    if response.status_code >= 400:
        data = b""
        async for part in response.aiter_bytes():
            data += part
            if len(data) >= MAX_ERROR_BODY:
                break
        body = data.decode("utf-8", "replace")
        raise ProviderError(f"{provider}: upstream answered HTTP {response.status_code}: {body}")
