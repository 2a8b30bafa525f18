"""The egress broker's gRPC face (ironclawd/api/egress.py) over a real gRPC server on a Unix
socket, with a scripted broker: body bytes already buffered go out joined, a body that trickles
in is never held back to fill a message, no message exceeds the socket's limit, a failure after
the head still reaches the agent, and a client that goes away closes the broker's stream (its
audit record and upstream close run)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from ironclaw.egress.v1 import egress_pb2, egress_pb2_grpc
from ironclawd.api.coalesce import Buffer
from ironclawd.api.egress import BODY, EgressServicer
from ironclawd.errors import PolicyDenied
from ironclawd.services.egress import End, FetchEvent, Head

Script = Callable[[], AsyncGenerator[FetchEvent, None]]


class ScriptedBroker:
    def __init__(self, script: Script) -> None:
        self.script = script

    def fetch(self, *_args: Any) -> AsyncGenerator[FetchEvent, None]:
        return self.script()


async def _served(
    tmp_path: Path, script: Script, max_message_bytes: int = 4 * 1024 * 1024
) -> tuple[grpc.aio.Server, grpc.aio.Channel]:
    server = grpc.aio.server()
    servicer = EgressServicer(ScriptedBroker(script), lambda: "s1", 30, max_message_bytes)  # type: ignore[arg-type]
    egress_pb2_grpc.add_EgressServiceServicer_to_server(servicer, server)
    sock = tmp_path / "egress.sock"
    server.add_insecure_port(f"unix:{sock}")
    await server.start()
    options = [("grpc.max_receive_message_length", max_message_bytes)]
    return server, grpc.aio.insecure_channel(f"unix:{sock}", options=options)


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_buffered_chunks_are_joined_and_a_large_one_split() -> None:
    async def main() -> None:
        buffer = Buffer(BODY, limit=1 << 20)
        await buffer.put(Head(200, "OK", ()))
        for part in (b"ab", b"cd", b"efghij"):
            await buffer.put(part)
        await buffer.put(End(False, 10))
        assert isinstance(await buffer.take(4), Head)
        assert await buffer.take(4) == b"abcd"
        assert await buffer.take(4) == b"efgh"
        assert await buffer.take(4) == b"ij"
        assert isinstance(await buffer.take(4), End)

    _run(main())


def test_the_reader_waits_while_the_buffer_is_full() -> None:
    async def main() -> None:
        buffer = Buffer(BODY, limit=4)
        await buffer.put(b"1234")
        blocked = asyncio.create_task(buffer.put(b"5"))
        await asyncio.sleep(0.05)
        assert not blocked.done()
        assert await buffer.take(2) == b"12"
        await asyncio.wait_for(blocked, 1)
        assert await buffer.take(10) == b"345"

    _run(main())


def test_a_body_arrives_whole_in_order_and_within_the_message_limit(tmp_path: Path) -> None:
    chunks = [bytes([n % 251]) * 16_384 for n in range(64)]

    async def script() -> AsyncGenerator[FetchEvent, None]:
        yield Head(200, "OK", (("content-type", "application/octet-stream"),))
        for chunk in chunks:
            yield chunk
        yield End(False, sum(map(len, chunks)))

    async def main() -> list[egress_pb2.FetchResponse]:
        server, channel = await _served(tmp_path, script, max_message_bytes=40_000)
        try:
            stub = egress_pb2_grpc.EgressServiceStub(channel)
            return [m async for m in stub.Fetch(egress_pb2.FetchRequest(url="https://x/"))]
        finally:
            await channel.close(None)
            await server.stop(None)

    messages = _run(main())
    assert messages[0].WhichOneof("event") == "head"
    assert messages[-1].WhichOneof("event") == "end"
    body = [m.body_chunk for m in messages[1:-1]]
    assert b"".join(body) == b"".join(chunks)
    assert all(0 < len(b) <= 40_000 - 64 for b in body)


def test_a_trickling_body_is_sent_as_it_comes(tmp_path: Path) -> None:
    """The broker yields its second chunk only after the client holds the first: a servicer
    that waited to fill a message would never deliver it."""
    seen_first = asyncio.Event()

    async def script() -> AsyncGenerator[FetchEvent, None]:
        yield Head(200, "OK", ())
        yield b"event: 1\n\n"
        await asyncio.wait_for(seen_first.wait(), 5)
        yield b"event: 2\n\n"
        yield End(False, 20)

    async def main() -> list[bytes]:
        server, channel = await _served(tmp_path, script)
        got: list[bytes] = []
        try:
            stub = egress_pb2_grpc.EgressServiceStub(channel)
            async for m in stub.Fetch(egress_pb2.FetchRequest(url="https://x/")):
                if m.WhichOneof("event") == "body_chunk":
                    got.append(m.body_chunk)
                    seen_first.set()
            return got
        finally:
            await channel.close(None)
            await server.stop(None)

    assert _run(main()) == [b"event: 1\n\n", b"event: 2\n\n"]


def test_a_failure_after_the_head_reaches_the_client(tmp_path: Path) -> None:
    async def script() -> AsyncGenerator[FetchEvent, None]:
        yield Head(200, "OK", ())
        yield b"partial"
        raise PolicyDenied("response refused: it carried a credential")

    kinds: list[str] = []

    async def read_all(stub: Any) -> None:  # an aio stub (the generated types are sync)
        async for m in stub.Fetch(egress_pb2.FetchRequest(url="https://x/")):
            kinds.append(str(m.WhichOneof("event")))

    async def main() -> grpc.aio.AioRpcError:
        server, channel = await _served(tmp_path, script)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await read_all(egress_pb2_grpc.EgressServiceStub(channel))
            return caught.value
        finally:
            await channel.close(None)
            await server.stop(None)

    error = _run(main())
    assert kinds[0] == "head"
    assert "end" not in kinds
    assert error.code() != grpc.StatusCode.OK


def test_a_client_that_goes_away_closes_the_brokers_stream(tmp_path: Path) -> None:
    closed = asyncio.Event()

    async def script() -> AsyncGenerator[FetchEvent, None]:
        try:
            yield Head(200, "OK", ())
            while True:  # an endless body: only the client's going away ends it
                yield b"x" * 65_536
                await asyncio.sleep(0)
        finally:
            closed.set()

    async def main() -> None:
        server, channel = await _served(tmp_path, script)
        try:
            stub = egress_pb2_grpc.EgressServiceStub(channel)
            call = stub.Fetch(egress_pb2.FetchRequest(url="https://x/"))
            async for m in call:
                if m.WhichOneof("event") == "body_chunk":
                    break
            call.cancel()
            await asyncio.wait_for(closed.wait(), 10)
        finally:
            await channel.close(None)
            await server.stop(None)

    _run(main())
    assert closed.is_set()
