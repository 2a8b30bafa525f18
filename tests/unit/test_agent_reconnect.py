"""A turn whose connection to the host ended is made again on a new one; a failure the host
answered is reported at once (agent/model.py ``_host_went_away``, issue 17).

The agent runs gRPC's legacy client (agent/__main__.py): it polls on the calling thread, so a
connection the host closed while the agent was idle is found out only when the next call fails
on it. Every status the host's sandbox API returns carries the ``ironclaw-answered`` trailer
(ironclawd/api/sandbox_calls.py); a failure without it is the connection's, not the model's.
Real gRPC servers on Unix sockets. The legacy client itself against a host that closed an idle
connection is tests/integration/test_agent_legacy_client.py (it needs a process of its own:
grpc reads the setting when it is first imported)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent import metered, model
from agent.model import ModelResponder
from ironclaw.model.v1 import model_pb2, model_pb2_grpc
from ironclawd.api import status

ANSWERED = ((metered.ANSWERED_KEY, "1"),)


class _Model(model_pb2_grpc.ModelServiceServicer):
    """Answers "mock: <text>"; the first ``failures`` Answer calls end UNAVAILABLE, with the
    host's trailer if ``answered``. Complete (a stream) is counted and never answered."""

    def __init__(self, failures: int = 0, answered: bool = True) -> None:
        self.failures, self.answered = failures, answered
        self.completes = 0  # Answer calls
        self.streams = 0  # Complete calls

    def GetProfile(self, request: Any, context: Any) -> model_pb2.GetProfileResponse:
        context.set_trailing_metadata(ANSWERED)
        return model_pb2.GetProfileResponse(agent="a", max_tool_rounds=2)

    def Answer(self, request: Any, context: Any) -> model_pb2.AnswerResponse:
        self.completes += 1
        if self.failures > 0:
            self.failures -= 1
            if self.answered:
                context.set_trailing_metadata(ANSWERED)
            context.abort(grpc.StatusCode.UNAVAILABLE, "provider down")
        return model_pb2.AnswerResponse(text=f"mock: {request.messages[-1].text}")

    def Complete(self, request: Any, context: Any) -> Iterator[model_pb2.CompleteResponse]:
        self.streams += 1
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the agent asks for whole answers")
        yield model_pb2.CompleteResponse()


def _serve(path: Path, servicer: _Model, options: list[tuple[str, Any]]) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=options)
    model_pb2_grpc.add_ModelServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    return server


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, _Model, list[grpc.Server]]]:
    servers: list[grpc.Server] = []
    yield tmp_path / "model.sock", _Model(), servers
    for server in servers:
        server.stop(None)


def test_the_host_and_the_agent_agree_on_the_trailer() -> None:
    assert status.ANSWERED_KEY == metered.ANSWERED_KEY
    assert status.ANSWERED == ANSWERED


def test_a_failure_the_host_answered_is_reported_and_not_made_again(
    served: tuple[Path, _Model, list[grpc.Server]],
) -> None:
    path, servicer, servers = served
    servicer.failures = 1
    servers.append(_serve(path, servicer, []))
    assert (
        ModelResponder(str(path))("hi") == "[the model is unavailable (unavailable): provider down]"
    )
    assert servicer.completes == 1


def test_a_failure_without_the_hosts_answer_is_made_again(
    served: tuple[Path, _Model, list[grpc.Server]],
) -> None:
    path, servicer, servers = served
    servicer.failures, servicer.answered = 2, False
    servers.append(_serve(path, servicer, []))
    assert ModelResponder(str(path))("hi") == "mock: hi"
    assert servicer.completes == 3


def test_a_host_that_stays_away_is_reported_at_the_grace_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model, "HOST_RESTART_GRACE", 0.5)
    reply = ModelResponder(str(tmp_path / "nobody.sock"))("hi")
    assert reply.startswith("[the model is unavailable (unavailable): "), reply


def test_the_agent_asks_for_the_whole_answer_in_one_message(
    served: tuple[Path, _Model, list[grpc.Server]],
) -> None:
    """It only joins the text, so it asks ``Answer`` (one message, sent with the call's status)
    and never the stream (an event, then the stream's end: each a read through the sandbox's
    sentry)."""
    path, servicer, servers = served
    servers.append(_serve(path, servicer, []))
    assert ModelResponder(str(path))("hi") == "mock: hi"
    assert (servicer.completes, servicer.streams) == (1, 0)
