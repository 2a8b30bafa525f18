"""A busy agent is paced, not refused (issue 17): when the host meters a sandbox's calls
(``[sockets] calls_per_second``) it refuses with RESOURCE_EXHAUSTED and a trailer saying when to
call again (ironclawd/api/sandbox_calls.py); the agent waits and calls again (agent/metered.py), so
its user sees the model's answer, never "too many calls: slow down". A budget reached for the
minute carries no trailer and still reaches the user as it did."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent import metered
from agent.model import ModelResponder
from ironclaw.model.v1 import model_pb2, model_pb2_grpc
from ironclawd.api import sandbox_calls, status
from ironclawd.api.limits import TokenBucket
from ironclawd.api.sandbox_sockets import SandboxPeer
from ironclawd.config import SocketsConfig
from tests.fakes import FakeClock, RecordingAudit
from tests.fakes.rpc import FailedCall


class _Model(model_pb2_grpc.ModelServiceServicer):
    """Refuses the first ``paced`` calls as the host's meter does, then answers; a text
    starting "budget" is refused as a spent budget (no trailer)."""

    def __init__(self, paced: int) -> None:
        self.paced = paced
        self.calls = 0

    def _meter(self, context: Any) -> None:
        self.calls += 1
        if self.paced > 0:
            self.paced -= 1
            context.abort_with_status(_Status("too many calls: slow down", "3"))

    def GetProfile(self, request: Any, context: Any) -> model_pb2.GetProfileResponse:
        self._meter(context)
        return model_pb2.GetProfileResponse(agent="a", max_tool_rounds=2)

    def Answer(self, request: Any, context: Any) -> model_pb2.AnswerResponse:
        self._meter(context)
        text = request.messages[-1].text
        if text.startswith("budget"):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rate limit of 2 model requests")
        return model_pb2.AnswerResponse(text=f"mock: {text}")

    def Complete(self, request: Any, context: Any) -> Iterator[model_pb2.CompleteResponse]:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the agent asks for whole answers")
        yield model_pb2.CompleteResponse()


class _Status(grpc.Status):
    def __init__(self, details: str, wait_ms: str) -> None:
        self.code = grpc.StatusCode.RESOURCE_EXHAUSTED
        self.details = details
        self.trailing_metadata = ((metered.RETRY_AFTER_KEY, wait_ms),)


@pytest.fixture
def model_socket(tmp_path: Path) -> Iterator[tuple[str, _Model]]:
    path = tmp_path / "model.sock"
    servicer = _Model(paced=0)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    model_pb2_grpc.add_ModelServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    yield str(path), servicer
    server.stop(None)


def test_a_paced_call_is_made_again_and_the_user_sees_the_answer(
    model_socket: tuple[str, _Model],
) -> None:
    path, model = model_socket
    model.paced = 5  # GetProfile once, then Answer four times
    responder = ModelResponder(path)
    assert responder("hello") == "mock: hello"
    assert model.calls == 7
    model.paced = 3
    assert responder("again") == "mock: again"


def test_a_spent_budget_still_reaches_the_user(model_socket: tuple[str, _Model]) -> None:
    path, _model = model_socket
    responder = ModelResponder(path)
    assert responder("budget gone") == "[I cannot answer now: rate limit of 2 model requests]"


def test_pacing_backs_off_and_gives_up_at_its_deadline() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    def refused() -> None:
        raise FailedCall(
            grpc.StatusCode.RESOURCE_EXHAUSTED, trailer=((metered.RETRY_AFTER_KEY, "2"),)
        )

    with pytest.raises(FailedCall):
        metered.call_metered(refused, deadline=3.0, sleep=sleep, monotonic=lambda: now[0])
    # The host's hint, then doubling back-off from 5 ms, capped at 1 s; never past the deadline.
    assert slept[:4] == [0.005, 0.01, 0.02, 0.04]
    assert max(slept) == metered.MAX_DELAY
    assert sum(slept) <= 3.0


@pytest.mark.parametrize(
    ("code", "trailer"),
    [
        (grpc.StatusCode.RESOURCE_EXHAUSTED, ()),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, ((metered.RETRY_AFTER_KEY, "soon"),)),
        (grpc.StatusCode.UNAVAILABLE, ((metered.RETRY_AFTER_KEY, "2"),)),
    ],
)
def test_other_refusals_are_not_retried(
    code: grpc.StatusCode, trailer: tuple[tuple[str, str], ...]
) -> None:
    calls = []

    def refused() -> None:
        calls.append(1)
        raise FailedCall(code, trailer=trailer)

    with pytest.raises(FailedCall):
        metered.call_metered(refused, sleep=lambda s: None)
    assert calls == [1]


class _Context:
    def __init__(self) -> None:
        self.aborted: tuple[Any, str, Any] | None = None
        self.trailer: Any = ()

    def set_trailing_metadata(self, trailer: Any) -> None:
        self.trailer = trailer

    async def abort(self, code: Any, details: str, trailing_metadata: Any = ()) -> None:
        self.aborted = (code, details, trailing_metadata)
        raise grpc.aio.AbortError()


def test_the_host_says_when_the_next_call_would_be_taken() -> None:
    assert status.RETRY_AFTER_KEY == metered.RETRY_AFTER_KEY
    clock = FakeClock(monotonic=10.0)
    limits = SocketsConfig(calls_per_second=50.0)
    audit = sandbox_calls.RefusalAudit(RecordingAudit(), clock)
    interceptor = sandbox_calls.PeerInterceptor({}, audit, limits)
    interceptor.rates["s1"] = TokenBucket(50.0, 1.0, clock=clock.monotonic)
    context = _Context()
    peer = SandboxPeer("s1", "model")
    asyncio.run(interceptor._meter(peer, context))  # type: ignore[arg-type]
    assert context.aborted is None
    assert context.trailer == ((status.ANSWERED_KEY, "1"),)  # see test_agent_reconnect.py
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(interceptor._meter(peer, context))  # type: ignore[arg-type]
    assert context.aborted is not None
    code, details, trailer = context.aborted
    assert (code, details) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "too many calls: slow down")
    assert trailer == ((sandbox_calls.RETRY_AFTER_KEY, "20"),)  # one token at 50 a second
