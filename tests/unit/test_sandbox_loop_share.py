"""Each session's calls have a share of the daemon's event loop (ironclawd/api/sandbox_calls.py,
api/limits.py ``Share`` and ``Charged``): what a call's steps take on the loop (the parse of its
request, the boundary's check, the servicer's own work between its awaits) is charged to its
session, and while that is overdrawn the session's calls are refused with the retry-after
trailer, before their requests are even parsed. A box looping on 4 MiB requests held the loop
for most of every second (found by a review); another session's calls are not held up.

In-process, through the real path: a session socket (api/sandbox_sockets.py), the splice and the
internal gRPC server with the interceptor and the model servicer."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from ironclaw.model.v1 import model_pb2, model_pb2_grpc
from ironclawd.api import control
from ironclawd.api.limits import Charged, Share
from ironclawd.api.sandbox import ModelServicer
from ironclawd.api.sandbox_calls import PeerInterceptor, RefusalAudit
from ironclawd.api.sandbox_sockets import SandboxPeer, SessionSockets
from ironclawd.api.status import RETRY_AFTER_KEY
from ironclawd.config import SocketsConfig
from ironclawd.domain.model import Chunk, Message, ToolDef
from tests.fakes import FakeClock, RecordingAudit

ANSWER = "/ironclaw.model.v1.ModelService/Answer"


def test_a_share_is_overdrawn_by_what_was_spent_and_refills_at_its_rate() -> None:
    clock = FakeClock(monotonic=10.0)
    share = Share(0.1, 0.25, clock=clock.monotonic)
    assert not share.overdrawn()
    share.spend(0.2)
    assert not share.overdrawn()  # 0.05 left: the next call is let in, whatever it costs
    share.spend(1.0)
    assert share.overdrawn()
    assert share.wait_seconds() == pytest.approx(9.5)  # 0.95 owed at 0.1 s a second
    clock.advance(9.4)
    assert share.overdrawn()
    clock.advance(0.2)
    assert not share.overdrawn()
    assert share.wait_seconds() == 0
    clock.advance(3600)
    share.spend(0.3)
    assert share.overdrawn()  # never more than the burst saved up


def test_charged_counts_each_step_of_the_awaited_code_and_passes_results_and_errors() -> None:
    readings = iter(range(0, 1000, 1))  # each reading of the CPU clock one second later
    charged: list[float] = []

    async def steps(fail: bool) -> str:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        if fail:
            raise ValueError("no")
        return "done"

    async def main() -> None:
        cpu: Callable[[], float] = lambda: float(next(readings))  # noqa: E731
        assert await Charged(steps(False), charged.append, cpu) == "done"
        assert charged == [1.0, 1.0, 1.0]  # three steps: to each sleep, then to the end
        with pytest.raises(ValueError, match="no"):
            await Charged(steps(True), charged.append, cpu)
        assert len(charged) == 6
        waiting = asyncio.ensure_future(Charged(asyncio.sleep(60), charged.append, cpu))
        await asyncio.sleep(0)
        waiting.cancel()  # thrown in: reaches the awaited code, and the wait ends cancelled
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())


class _Proxy:
    async def complete(
        self, sid: str, messages: list[Message], tools: list[ToolDef], max_tokens: int
    ) -> AsyncIterator[Chunk]:
        yield Chunk(text=f"for {sid}")


class _Cpu:
    """A CPU clock each reading of which is ``step`` seconds after the last: every step a call
    takes on the loop costs ``step``."""

    def __init__(self) -> None:
        self.now, self.step = 0.0, 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now


async def _sandbox_api(
    tmp_path: Path, cpu: _Cpu, body: Callable[[dict[str, grpc.aio.Channel]], Awaitable[None]]
) -> None:
    limits = SocketsConfig()
    peers: dict[str, SandboxPeer] = {}
    internal = tmp_path / "internal.sock"
    interceptor = PeerInterceptor(peers, RefusalAudit(RecordingAudit(), FakeClock()), limits,
                                  cpu=cpu)  # fmt: skip
    server = grpc.aio.server(interceptors=[interceptor])
    servicer = ModelServicer(_Proxy(), limits.max_message_bytes)  # type: ignore[arg-type]
    model_pb2_grpc.add_ModelServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{internal}")
    await server.start()
    sockets = SessionSockets(internal, tmp_path, limits, peers)
    channels = {}
    try:
        for sid in ("s1", "s2"):
            (tmp_path / sid).mkdir()
            interceptor.meter(sid)
            await sockets.open(sid, "model")
            channels[sid] = grpc.aio.insecure_channel(f"unix:{sockets.path(sid, 'model')}")
        await body(channels)
    finally:
        for channel in channels.values():
            await channel.close(None)
        await sockets.close_all()
        await server.stop(0)


async def _answer(channel: grpc.aio.Channel, raw: bytes) -> tuple[str, str]:
    """(status, retry-after trailer) of an Answer call with request bytes ``raw``."""
    call = channel.unary_unary(ANSWER, None, None)(raw, timeout=10)
    with contextlib.suppress(grpc.aio.AioRpcError):
        await call
    trailer = dict(await call.trailing_metadata() or ())
    return (await call.code()).name, str(trailer.get(RETRY_AFTER_KEY, ""))


def test_calls_that_overdraw_their_sessions_share_hold_up_its_next_calls_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control, "peer_in_unit", lambda sock, unit: True)
    monkeypatch.setattr(os, "chown", lambda *args, **kwargs: None)
    defaults = SocketsConfig()
    assert (defaults.loop_share, defaults.loop_share_burst_seconds) == (0.1, 0.25)
    request = model_pb2.CompleteRequest(
        messages=[model_pb2.Message(role=model_pb2.ROLE_USER, text="hi")]
    ).SerializeToString()
    garbage = b"\x0a\x05\x1a\x03\xff\xfe\xfd"  # messages[0].text that is not UTF-8
    cpu = _Cpu()

    async def body(channels: dict[str, grpc.aio.Channel]) -> None:
        s1, s2 = channels["s1"], channels["s2"]
        # Cheap calls are all let in; a request out of shape is parsed and refused as such.
        assert [await _answer(s1, request) for _ in range(5)] == [("OK", "")] * 5
        assert await _answer(s1, garbage) == ("INVALID_ARGUMENT", "")
        cpu.step = 0.5  # from here each step of a call holds the loop half a second
        assert await _answer(s1, request) == ("OK", "")  # let in: the share was not overdrawn
        code, wait = await _answer(s1, request)
        assert code == "RESOURCE_EXHAUSTED"
        # One step (the fake proxy never waits): 0.5 s spent of 0.25 saved, 0.25 s owed at a
        # tenth of a second a second.
        assert 2000 < int(wait) <= 2500
        # Refused before its bytes are parsed: the same answer, not INVALID_ARGUMENT.
        assert (await _answer(s1, garbage))[0] == "RESOURCE_EXHAUSTED"
        cpu.step = 0.0
        assert await _answer(s2, request) == ("OK", "")  # another session's share is its own
        assert (await _answer(s1, request))[0] == "RESOURCE_EXHAUSTED"

    asyncio.run(asyncio.wait_for(_sandbox_api(tmp_path, cpu, body), 30))


def test_the_retry_after_trailer_is_what_the_agent_waits_for(tmp_path: Path) -> None:
    interceptor = PeerInterceptor({}, RefusalAudit(RecordingAudit(), FakeClock()),
                                  SocketsConfig(loop_share=0.5,
                                                loop_share_burst_seconds=0.0))  # fmt: skip
    interceptor.meter("s1")
    interceptor.shares["s1"].spend(2.0)
    aborted: list[Any] = []

    class Context:
        def set_trailing_metadata(self, trailer: Any) -> None:
            pass

        async def abort(self, code: Any, details: str, trailing_metadata: Any = ()) -> None:
            aborted.append((code, details, dict(trailing_metadata)))
            raise grpc.aio.AbortError()

    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(interceptor._meter(SandboxPeer("s1", "model"), Context()))  # type: ignore[arg-type]
    ((code, details, trailer),) = aborted
    assert (code, details) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "too many calls: slow down")
    assert 3900 < int(trailer[RETRY_AFTER_KEY]) <= 4000  # 2 s owed at half a second a second
    interceptor.forget("s1")
    asyncio.run(interceptor._meter(SandboxPeer("s1", "model"), Context()))  # type: ignore[arg-type]
    assert len(aborted) == 1  # a session no longer metered (its sockets closed) is not refused
