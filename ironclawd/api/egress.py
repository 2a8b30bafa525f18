"""The egress broker's gRPC face on each granted session's ``egress.sock`` (api/sandbox.py routes
it there and says which session is calling).

Body bytes already buffered while the previous message is written go out joined (api/coalesce.py),
and a body still arriving back to back is given a few turns of the event loop to join before
each message ("settle", no timer): at most 1 MiB a message and never over the socket's
``max_message_bytes``. A fast body goes in few large messages instead of one per TLS record
(issue 17: 4 MiB was 0.53x a direct fetch, then 0.70-0.76x with the agent's client while most
records still went alone), a trickling one as it comes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from ironclaw.egress.v1 import egress_pb2, egress_pb2_grpc
from ironclawd.api.coalesce import Joining, coalesced
from ironclawd.services.egress import EgressBroker, End, FetchEvent, Head

# A client that stops reading holds its stream open with HTTP/2 flow control, out of reach of
# the broker's own deadline (which runs only while the broker is resumed): past this margin the
# call is cancelled from outside.
BACKSTOP_MARGIN_SECONDS = 5.0
MAX_CHUNK_BYTES = 1024 * 1024  # per message; also bounded by the socket's max_message_bytes
READ_AHEAD_BYTES = 2 * MAX_CHUNK_BYTES  # read ahead of the agent at most this much
# Turns of the event loop in a row that add nothing before a body message goes out (a TLS
# record came every ~3 turns in the egress bench; api/coalesce.py, "settle").
SETTLE_TURNS = 8

BODY = Joining[FetchEvent](
    size=lambda e: len(e) if isinstance(e, bytes) else None,
    join=lambda parts: b"".join(p for p in parts if isinstance(p, bytes)),
    split=lambda e, n: (e[:n], e[n:]) if isinstance(e, bytes) else (e, b""),
)


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
        # aclosing: a client that goes away closes the relay (and so the broker) now, not when
        # the garbage collector finalizes the generator.
        relay = coalesced(events, BODY, max_size=self._max_chunk, read_ahead=READ_AHEAD_BYTES,
                          settle=SETTLE_TURNS)  # fmt: skip
        try:
            async with contextlib.aclosing(relay):
                async for event in relay:
                    yield _message(event)
        finally:
            timer.cancel()


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
