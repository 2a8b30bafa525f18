"""The agent's gRPC client is the legacy one (``agent.GRPC_ENVIRONMENT``, set by
agent/__main__.py): it polls on the calling thread, so a connection the host closed while the
agent was idle is found out only when the next call fails on it. That call never reached the
host (no ``ironclaw-answered`` trailer), so the turn is made again on a new connection
(agent/model.py ``_host_went_away``) and the user gets the model's answer, not "the model is
unavailable". A daemon restart ends the agent's connections the same way. The agent's side runs
in a process of its own with the setting the frozen agent has; the host's side is a real gRPC
server on a Unix socket. The rule itself is in tests/unit/test_agent_reconnect.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from ironclaw.model.v1 import model_pb2, model_pb2_grpc
from tests.integration.conftest import ROOT


class _Model(model_pb2_grpc.ModelServiceServicer):
    def __init__(self) -> None:
        self.completes = 0

    def GetProfile(self, request: Any, context: Any) -> model_pb2.GetProfileResponse:
        return model_pb2.GetProfileResponse(agent="a", max_tool_rounds=2)

    def Answer(self, request: Any, context: Any) -> model_pb2.AnswerResponse:
        self.completes += 1
        return model_pb2.AnswerResponse(text=f"mock: {request.messages[-1].text}")

    def Complete(self, request: Any, context: Any) -> Iterator[model_pb2.CompleteResponse]:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the agent asks for whole answers")
        yield model_pb2.CompleteResponse()


# The agent's side in a process of its own, with the legacy client as the frozen agent has it.
_CLIENT = """
import os, sys, time
from agent import GRPC_ENVIRONMENT
os.environ.update(GRPC_ENVIRONMENT)
from agent.model import ModelResponder
responder = ModelResponder(sys.argv[1])
print(responder("one"), flush=True)
time.sleep(float(sys.argv[2]))
print(responder("two"), flush=True)
"""


def test_a_connection_the_host_closed_while_the_agent_was_idle_is_replaced(
    tmp_path: Path,
) -> None:
    path = tmp_path / "model.sock"
    servicer = _Model()
    # The host closes a connection idle for 0.3 s (``[sockets] idle_timeout_seconds``; a daemon
    # restart ends it the same way); the agent's next turn comes after 1.5 s.
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2), options=[("grpc.max_connection_idle_ms", 300)]
    )
    model_pb2_grpc.add_ModelServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GRPC_EXPERIMENTS", None)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CLIENT, str(path), "1.5"],
            check=False, capture_output=True, text=True, timeout=60, env=env, cwd=ROOT,
        )  # fmt: skip
    finally:
        server.stop(None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["mock: one", "mock: two"], done.stderr
    # The turn that failed on the closed connection never reached the host.
    assert servicer.completes == 2


_WARM = """
import os, time
from agent import GRPC_ENVIRONMENT
os.environ.update(GRPC_ENVIRONMENT)
from agent.model import warm_grpc
before = len(os.listdir("/proc/self/task"))
warm_grpc()
time.sleep(0.5)
print(before, len(os.listdir("/proc/self/task")))
"""


def test_warming_grpc_leaves_no_thread_behind() -> None:
    """What makes the warm-up free for a pooled sandbox that waits for its claim (agent/main.py
    ``warm_grpc``): with its channel closed, gRPC's threads end."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GRPC_EXPERIMENTS", None)
    done = subprocess.run(
        [sys.executable, "-c", _WARM],
        check=False, capture_output=True, text=True, timeout=60, env=env, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1"], "threads before and after the warm-up"
