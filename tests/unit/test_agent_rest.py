"""An idle agent rests (agent/loop.py, agent/model.py): ``IDLE_SECONDS`` after its last reply it
closes its gRPC channels, whose threads would otherwise wake an idle sandbox ~8 times a second
(~90% of its CPU under gVisor's ptrace platform, issue 17), and the next message opens them
again. The loop runs here against real queue files and a socket pair standing for the control
socket; the model's channel against a real gRPC server on a Unix socket."""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import sqlcipher3

from agent import egress, loop, mcp, queues
from agent.model import ModelResponder
from ironclaw.model.v1 import model_pb2, model_pb2_grpc
from ironclawd.store.queues import INBOUND_SCHEMA


class CountingResponder:
    def __init__(self) -> None:
        self.asked: list[str] = []
        self.rests = 0

    def __call__(self, text: str) -> str:
        self.asked.append(text)
        return f"re: {text}"

    def rest(self) -> None:
        self.rests += 1


def _wait_for(check: Any, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _line(sock: socket.socket) -> bytes:
    got = b""
    while not got.endswith(b"\n"):
        chunk = sock.recv(1)
        assert chunk, "the agent closed the control socket"
        got += chunk
    return got


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    key = secrets.token_bytes(32)
    (tmp_path / "key").write_text(key.hex())
    monkeypatch.setattr(loop, "KEY_FILE", tmp_path / "key")
    monkeypatch.setattr(loop, "INBOUND_DB", tmp_path / "inbound.db")
    monkeypatch.setattr(loop, "OUTBOUND_DB", tmp_path / "outbound.db")
    monkeypatch.setattr(loop, "IDLE_SECONDS", 0.2)
    host = sqlcipher3.connect(str(tmp_path / "inbound.db"), isolation_level=None)
    host.execute(f"PRAGMA key = \"x'{key.hex()}'\"")
    host.execute("PRAGMA journal_mode = DELETE")
    host.execute(INBOUND_SCHEMA)
    yield host
    host.close()


@contextlib.contextmanager
def _agent(responder: loop.Responder) -> Iterator[socket.socket]:
    """The agent's loop on a thread, serving one end of a socket pair; the host's end, after
    the hello, is yielded. The loop must end when that end closes, and without an error."""
    ours, theirs = socket.socketpair()
    failed: list[BaseException] = []

    def run() -> None:  # the agent's queues belong to the thread that opens them
        try:
            loop.Agent(responder).serve(theirs)
        except BaseException as exc:
            failed.append(exc)

    serving = threading.Thread(target=run, daemon=True)
    serving.start()
    try:
        assert _line(ours).startswith(b"hello ")
        yield ours
    finally:
        ours.close()
        serving.join(5)
        theirs.close()
    assert not serving.is_alive()
    assert not failed


def test_the_responder_rests_once_idle_and_answers_again(world: sqlcipher3.Connection) -> None:
    responder = CountingResponder()
    with _agent(responder) as ours:
        # A new connection drops what the responder kept open for the previous host.
        assert responder.rests == 1
        time.sleep(0.5)
        assert responder.rests == 1  # nothing answered yet: nothing open, no timer
        for n, text in ((1, "one"), (2, "two")):
            world.execute("INSERT INTO messages (created_at, body) VALUES (1.0, ?)", (text,))
            ours.sendall(f"inbound {n}\n".encode())
            assert _line(ours) == f"outbound {n}\n".encode()
            _wait_for(lambda n=n: responder.rests == n + 1, f"rest number {n}")
            time.sleep(0.5)
            assert responder.rests == n + 1  # once per quiet spell, not every IDLE_SECONDS
        assert responder.asked == ["one", "two"]


def test_a_restarted_host_makes_the_responder_drop_its_channels(
    world: sqlcipher3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new daemon that took the connection back from systemd's fd store says "restarted 0"
    first: the connections under the responder's channels ended with the old daemon, and the
    agent's gRPC client would find that out only by failing a call on each."""
    monkeypatch.setattr(loop, "IDLE_SECONDS", 60.0)  # no rest for being idle in this test
    responder = CountingResponder()
    with _agent(responder) as ours:
        assert responder.rests == 1  # the connection's own
        world.execute("INSERT INTO messages (created_at, body) VALUES (1.0, 'one')")
        ours.sendall(b"restarted 0\ninbound 1\n")
        assert _line(ours) == b"outbound 1\n"
        assert responder.rests == 2  # before the message was answered
        assert responder.asked == ["one"]
        ours.sendall(b"restarted x\nrestarted\n")  # not the host's line: ignored
        time.sleep(0.1)
        assert responder.rests == 2


def test_a_message_queued_before_the_restart_line_is_answered(
    world: sqlcipher3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message sent to a new daemon before it took the agent's connection back from the fd
    store is queued with no connection to announce it on ("waits in its queue"). The
    "restarted" line is all the agent hears: it reads its queue then, unasked."""
    monkeypatch.setattr(loop, "IDLE_SECONDS", 60.0)
    responder = CountingResponder()
    with _agent(responder) as ours:
        ours.settimeout(5)  # a fail, not a hang, if the agent waits for an "inbound" line
        world.execute("INSERT INTO messages (created_at, body) VALUES (1.0, 'while adopting')")
        ours.sendall(b"restarted 0\n")
        assert _line(ours) == b"outbound 1\n"
        assert responder.asked == ["while adopting"]
        ours.sendall(b"inbound 1\n")  # announced again later: answered once only
        time.sleep(0.1)
        assert responder.asked == ["while adopting"]


def test_ingested_replies_are_pruned_after_the_messages_are_answered(
    world: sqlcipher3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "ingested <seq>" from the host: the agent drops its rows up to seq (all but the newest)
    once the messages that came with it are answered; a stale one changes nothing."""
    monkeypatch.setattr(loop, "IDLE_SECONDS", 60.0)

    def outbound_seqs() -> list[int] | None:
        # Read-only, as the host reads: a read that meets the agent mid-commit (its journal is
        # hot: "attempt to write a readonly database") is no answer yet, and is asked again.
        db = sqlcipher3.connect(f"file:{loop.OUTBOUND_DB}?mode=ro", uri=True)
        try:
            db.execute(f"PRAGMA key = \"x'{loop.KEY_FILE.read_text().strip()}'\"")
            return [r[0] for r in db.execute("SELECT seq FROM messages ORDER BY seq")]
        except sqlcipher3.OperationalError:
            return None
        finally:
            db.close()

    with _agent(CountingResponder()) as ours:
        for n in (1, 2, 3):
            world.execute("INSERT INTO messages (created_at, body) VALUES (1.0, ?)", (f"m{n}",))
        ours.sendall(b"inbound 3\n")
        assert [_line(ours) for _ in range(3)] == [
            b"outbound 1\n",
            b"outbound 2\n",
            b"outbound 3\n",
        ]
        world.execute("INSERT INTO messages (created_at, body) VALUES (1.0, 'm4')")
        ours.sendall(b"ingested 2\ninbound 4\n")
        assert _line(ours) == b"outbound 4\n"
        _wait_for(lambda: outbound_seqs() == [3, 4], "rows 1 and 2 pruned")
        ours.sendall(b"ingested 1\ningested x\n")  # stale, and not the host's line
        world.execute("INSERT INTO messages (created_at, body) VALUES (1.0, 'm5')")
        ours.sendall(b"inbound 5\n")
        assert _line(ours) == b"outbound 5\n"
        assert outbound_seqs() == [3, 4, 5]
        ours.sendall(b"ingested 5\n")
        _wait_for(lambda: outbound_seqs() == [5], "all but the newest pruned")


def test_a_failed_prune_costs_only_space(
    world: sqlcipher3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tmpfs full, say: the agent keeps answering, and tries again at the next
    announcement."""
    monkeypatch.setattr(loop, "IDLE_SECONDS", 60.0)
    asked: list[int] = []

    def full(self: object, up_to: int) -> None:
        asked.append(up_to)
        raise sqlcipher3.OperationalError("database or disk is full")

    monkeypatch.setattr(queues.Outbound, "prune", full)
    with _agent(CountingResponder()) as ours:
        world.execute("INSERT INTO messages (created_at, body) VALUES (1.0, 'm1')")
        ours.sendall(b"inbound 1\ningested 1\n")
        assert _line(ours) == b"outbound 1\n"
        world.execute("INSERT INTO messages (created_at, body) VALUES (1.0, 'm2')")
        ours.sendall(b"ingested 1\ninbound 2\n")
        assert _line(ours) == b"outbound 2\n"
        _wait_for(lambda: asked == [1, 1], "the prune tried again")


class Model(model_pb2_grpc.ModelServiceServicer):
    def GetProfile(self, request: Any, context: Any) -> model_pb2.GetProfileResponse:
        return model_pb2.GetProfileResponse(agent="a", max_tool_rounds=2)

    def Answer(self, request: Any, context: Any) -> model_pb2.AnswerResponse:
        return model_pb2.AnswerResponse(text=f"ok: {request.messages[-1].text}")

    def Complete(self, request: Any, context: Any) -> Iterator[model_pb2.CompleteResponse]:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the agent asks for whole answers")
        yield model_pb2.CompleteResponse()


class CountingModel(Model):
    def __init__(self) -> None:
        self.profiles = 0

    def GetProfile(self, request: Any, context: Any) -> model_pb2.GetProfileResponse:
        self.profiles += 1
        return super().GetProfile(request, context)


@contextlib.contextmanager
def _model_server(sock: Path) -> Iterator[CountingModel]:
    server = grpc.server(futures.ThreadPoolExecutor(2))
    model = CountingModel()
    model_pb2_grpc.add_ModelServiceServicer_to_server(model, server)
    server.add_insecure_port(f"unix:{sock}")
    server.start()
    try:
        yield model
    finally:
        server.stop(None)


def test_rest_closes_the_channels_and_the_next_turn_opens_one(tmp_path: Path) -> None:
    sock = tmp_path / "model.sock"
    with _model_server(sock):
        responder = ModelResponder(str(sock))
        assert responder._channel is None  # nothing is opened before the first message
        assert responder("hi") == "ok: hi"
        first = responder._channel
        assert first is not None
        egress._channels["/x/egress.sock"] = grpc.insecure_channel(f"unix:{tmp_path}/e.sock")
        mcp._channels["/x/mcp.sock"] = grpc.insecure_channel(f"unix:{tmp_path}/m.sock")
        responder.rest()
        assert responder._channel is None
        assert not egress._channels
        assert not mcp._channels
        with pytest.raises(ValueError, match="closed channel"):
            model_pb2_grpc.ModelServiceStub(first).GetProfile(model_pb2.GetProfileRequest())
        assert responder("again") == "ok: again"
        assert responder._channel is not None
        responder.rest()


def test_a_claimed_agent_is_ready_for_its_first_message_and_rests_if_none_comes(
    world: sqlcipher3.Connection, tmp_path: Path
) -> None:
    """A pooled sandbox's first connection after its claim (``claimed``): the responder opens
    its channel and fetches the profile before any message; with no message it rests after
    IDLE_SECONDS like any idle agent; the first message needs no second profile."""
    with _model_server(tmp_path / "model.sock") as model:
        responder = ModelResponder(str(tmp_path / "model.sock"))
        ours, theirs = socket.socketpair()
        serving = threading.Thread(
            target=lambda: loop.Agent(responder).serve(theirs, claimed=True), daemon=True
        )
        serving.start()
        try:
            assert _line(ours).startswith(b"hello ")
            _wait_for(lambda: model.profiles == 1, "the profile fetched before any message")
            _wait_for(lambda: responder._channel is None, "the rest after IDLE_SECONDS")
            world.execute("INSERT INTO messages (created_at, body) VALUES (1.0, 'one')")
            ours.sendall(b"inbound 1\n")
            assert _line(ours) == b"outbound 1\n"
            assert model.profiles == 1  # kept across the rest: it changes only with a restart
        finally:
            ours.close()
            serving.join(5)
            theirs.close()
        assert not serving.is_alive()


def test_a_connection_that_is_not_a_claim_prepares_nothing(
    world: sqlcipher3.Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "IDLE_SECONDS", 60.0)
    with _model_server(tmp_path / "model.sock") as model:
        responder = ModelResponder(str(tmp_path / "model.sock"))
        with _agent(responder) as ours:
            time.sleep(0.3)
            assert model.profiles == 0
            assert responder._channel is None
            world.execute("INSERT INTO messages (created_at, body) VALUES (1.0, 'one')")
            ours.sendall(b"inbound 1\n")
            assert _line(ours) == b"outbound 1\n"
            assert model.profiles == 1


def test_a_failed_preparation_leaves_the_profile_to_the_first_turn(tmp_path: Path) -> None:
    """No proxy yet when the claimed agent prepares: the first turn asks for the profile."""
    sock = tmp_path / "model.sock"
    responder = ModelResponder(str(sock))
    responder.prepare()
    responder._prepared()  # refused at once: nothing listens
    assert responder._profile is None
    with _model_server(sock) as model:
        assert responder("hi") == "ok: hi"
        assert model.profiles == 1
    responder.rest()
