"""The egress broker's gRPC face on each granted session's ``egress.sock`` (api/sandbox.py routes
it there and says which session is calling).

Body bytes reach the agent coalesced while the previous message is being written: the broker
is read by a task of its own into a bounded buffer, and each message takes everything buffered
at that moment (at most ``max_chunk`` bytes). A body that trickles in (a stream of events) is
sent as it comes, never held back to fill a message; a fast body goes in few large messages
instead of one per TLS record (issue 17: 4 MiB was 0.53x a direct fetch)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import grpc

from ironclaw.egress.v1 import egress_pb2, egress_pb2_grpc
from ironclawd.services.egress import EgressBroker, End, FetchEvent, Head

# A client that stops reading holds its stream open with HTTP/2 flow control, out of reach of
# the broker's own deadline (which runs only while the broker is resumed): past this margin the
# call is cancelled from outside.
BACKSTOP_MARGIN_SECONDS = 5.0
MAX_CHUNK_BYTES = 1024 * 1024  # per message; also bounded by the socket's max_message_bytes
BUFFER_BYTES = 2 * MAX_CHUNK_BYTES  # read ahead of the agent at most this much
_DONE = object()


class _Buffer:
    """Events from the broker, in order, with the bytes waiting bounded: the reader waits while
    ``limit`` bytes are unsent (HTTP/2 flow control then reaches the upstream as before)."""

    def __init__(self, limit: int) -> None:
        self._items: list[object] = []
        self._bytes = 0
        self._limit = limit
        self._changed = asyncio.Condition()

    async def put(self, item: object) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._bytes < self._limit)
            self._items.append(item)
            if isinstance(item, bytes):
                self._bytes += len(item)
            self._changed.notify_all()

    async def take(self, max_bytes: int) -> object:
        """The next event; consecutive body chunks already buffered come joined (up to
        ``max_bytes``, a larger chunk split)."""
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._items))
            first = self._items[0]
            if not isinstance(first, bytes):
                self._items.pop(0)
                return first
            parts: list[bytes] = []
            size = 0
            while self._items and isinstance(self._items[0], bytes) and size < max_bytes:
                chunk = self._items[0]
                assert isinstance(chunk, bytes)
                room = max_bytes - size
                if len(chunk) > room:
                    parts.append(chunk[:room])
                    self._items[0] = chunk[room:]
                    size += room
                    break
                parts.append(chunk)
                self._items.pop(0)
                size += len(chunk)
            self._bytes -= size
            self._changed.notify_all()
            return parts[0] if len(parts) == 1 else b"".join(parts)


class EgressServicer(egress_pb2_grpc.EgressServiceServicer):
    def __init__(
        self,
        broker: EgressBroker,
        current_sid: Callable[[], str],
        timeout_seconds: float,
        max_message_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self._broker = broker
        self._current_sid = current_sid
        self._backstop = timeout_seconds + BACKSTOP_MARGIN_SECONDS
        # Room for the message's framing: a body chunk never makes a message over the limit.
        self._max_chunk = max(1, min(MAX_CHUNK_BYTES, max_message_bytes - 64))

    async def Fetch(
        self, request: egress_pb2.FetchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[egress_pb2.FetchResponse]:
        task = asyncio.current_task()
        assert task is not None
        timer = asyncio.get_running_loop().call_later(self._backstop, task.cancel)
        headers = [(h.name, h.value) for h in request.headers]
        events = self._broker.fetch(
            self._current_sid(), request.method, request.url, headers, request.body
        )
        buffer = _Buffer(BUFFER_BYTES)

        async def read() -> None:
            try:
                async for event in events:
                    await buffer.put(event)
            except Exception as exc:  # handed to the writer, raised there
                await buffer.put(_Failed(exc))
                return
            await buffer.put(_DONE)

        reader = asyncio.create_task(read())
        try:
            while True:
                item = await buffer.take(self._max_chunk)
                if item is _DONE:
                    break
                if isinstance(item, _Failed):
                    raise item.exc
                yield _message(cast(FetchEvent, item))
        finally:
            timer.cancel()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            await events.aclose()  # the broker's audit and upstream close run here


class _Failed:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc


def _message(event: FetchEvent) -> egress_pb2.FetchResponse:
    if isinstance(event, Head):
        return egress_pb2.FetchResponse(
            head=egress_pb2.ResponseHead(
                status=event.status,
                reason=event.reason,
                headers=[egress_pb2.Header(name=k, value=v) for k, v in event.headers],
            )
        )
    if isinstance(event, End):
        return egress_pb2.FetchResponse(
            end=egress_pb2.ResponseEnd(truncated=event.truncated, body_bytes=event.body_bytes)
        )
    return egress_pb2.FetchResponse(body_chunk=event)
