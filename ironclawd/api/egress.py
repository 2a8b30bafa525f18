"""The egress broker's gRPC face on each granted session's ``egress.sock`` (api/sandbox.py routes
it there and says which session is calling)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from ironclaw.egress.v1 import egress_pb2, egress_pb2_grpc
from ironclawd.services.egress import EgressBroker, End, Head

# A client that stops reading holds its stream open with HTTP/2 flow control, out of reach of
# the broker's own deadline (which runs only while the broker is resumed): past this margin the
# call is cancelled from outside.
BACKSTOP_MARGIN_SECONDS = 5.0


class EgressServicer(egress_pb2_grpc.EgressServiceServicer):
    def __init__(
        self, broker: EgressBroker, current_sid: Callable[[], str], timeout_seconds: float
    ) -> None:
        self._broker = broker
        self._current_sid = current_sid
        self._backstop = timeout_seconds + BACKSTOP_MARGIN_SECONDS

    async def Fetch(
        self, request: egress_pb2.FetchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[egress_pb2.FetchResponse]:
        task = asyncio.current_task()
        assert task is not None
        timer = asyncio.get_running_loop().call_later(self._backstop, task.cancel)
        headers = [(h.name, h.value) for h in request.headers]
        try:
            async for event in self._broker.fetch(
                self._current_sid(), request.method, request.url, headers, request.body
            ):
                if isinstance(event, Head):
                    yield egress_pb2.FetchResponse(
                        head=egress_pb2.ResponseHead(
                            status=event.status,
                            reason=event.reason,
                            headers=[egress_pb2.Header(name=k, value=v) for k, v in event.headers],
                        )
                    )
                elif isinstance(event, End):
                    yield egress_pb2.FetchResponse(
                        end=egress_pb2.ResponseEnd(
                            truncated=event.truncated, body_bytes=event.body_bytes
                        )
                    )
                else:
                    yield egress_pb2.FetchResponse(body_chunk=event)
        finally:
            timer.cancel()
