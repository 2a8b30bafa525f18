"""ironctl's gRPC client (ironclawd/ctl/wire.py, h2) against a real grpcio server on a Unix
socket, call for call beside grpcio's own client: the same responses, the same status codes and
messages, deadlines, messages larger than HTTP/2's windows both ways, a stream left early and
the next call on the same connection, a server that is gone or goes away."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import pytest

from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from ironclawd.ctl import exitcodes, rpc, wire
from ironclawd.ctl.main import main

BIG = 3 * 1024 * 1024  # over HTTP/2's default window (64 KiB) and frame size (16 KiB)


class Servicer(admin_pb2_grpc.AdminServiceServicer):
    """A few methods with known answers; every other one is grpcio's UNIMPLEMENTED."""

    def __init__(self) -> None:
        self.watch_ended = threading.Event()
        self.received: list[int] = []

    def GetStatus(self, request: Any, context: Any) -> admin_pb2.GetStatusResponse:
        return admin_pb2.GetStatusResponse(version="9.9", pid=42, state="ready")

    def SubmitChange(self, request: Any, context: Any) -> admin_pb2.SubmitChangeResponse:
        self.received.append(len(request.payload_json))
        if request.kind == "refuse":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "kind 'refuse': naïve → refused 100%")
        if request.kind == "slow":
            time.sleep(2)
        return admin_pb2.SubmitChangeResponse(change=admin_pb2.Change(id=request.reason))

    def ListAudit(self, request: Any, context: Any) -> admin_pb2.ListAuditResponse:
        size = BIG if request.limit == 1 else 5 * 1024 * 1024
        return admin_pb2.ListAuditResponse(records=["a" * size])

    def WatchReplies(self, request: Any, context: Any) -> Iterator[admin_pb2.WatchRepliesResponse]:
        try:
            for seq in range(1, 4):
                yield admin_pb2.WatchRepliesResponse(reply=admin_pb2.Reply(seq=seq, text="x" * seq))
            if request.follow:
                while context.is_active():
                    time.sleep(0.01)
            elif request.sid == "fail":
                context.abort(grpc.StatusCode.NOT_FOUND, "session fail: no such session")
        finally:
            self.watch_ended.set()


def serve(path: str, servicer: Servicer, options: Sequence[tuple[str, Any]] = ()) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=options)
    admin_pb2_grpc.add_AdminServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    return server


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Servicer, grpc.Server]]:
    path = str(tmp_path / "admin.sock")
    servicer = Servicer()  # type: ignore[abstract]  # (the rest: grpcio's UNIMPLEMENTED)
    server = serve(path, servicer)
    yield path, servicer, server
    server.stop(None)


@contextlib.contextmanager
def ironctl_stub(path: str) -> Iterator[Any]:
    """ironctl's own stub (wire.py) on one connection to ``path``."""
    channel = wire.Channel(path)
    try:
        yield rpc.stub_for(channel)
    finally:
        channel.close()


Outcome = tuple[str, Any]


def both(path: str, call: Callable[[Any], Any]) -> tuple[Outcome, Outcome]:
    """``call`` made with grpcio's stub and with ironctl's, each as (status name, result)."""
    outcomes = []
    for client in ("grpcio", "wire"):
        if client == "grpcio":
            channel: Any = grpc.insecure_channel(f"unix:{path}")
            stub: Any = admin_pb2_grpc.AdminServiceStub(channel)
            error: type[Exception] = grpc.RpcError
        else:
            channel = wire.Channel(path)
            stub = rpc.stub_for(channel)
            error = wire.RpcError
        try:
            outcomes.append(("OK", call(stub)))
        except error as err:
            outcomes.append((err.code().name, err.details()))  # type: ignore[attr-defined]
        finally:
            channel.close()
    return outcomes[0], outcomes[1]


def test_status_codes_are_grpcs() -> None:
    assert [(c.name, c.value[0]) for c in grpc.StatusCode] == [
        (c.name, c.value) for c in wire.StatusCode
    ]


def test_a_unary_call_answers_as_with_grpcio(served: tuple[str, Servicer, grpc.Server]) -> None:
    path, _, _ = served
    ours, theirs = both(path, lambda s: s.GetStatus(admin_pb2.GetStatusRequest(), timeout=5))
    assert ours == theirs
    assert theirs[1] == admin_pb2.GetStatusResponse(version="9.9", pid=42, state="ready")


def test_a_refusal_carries_its_code_and_its_words(
    served: tuple[str, Servicer, grpc.Server],
) -> None:
    path, _, _ = served
    request = admin_pb2.SubmitChangeRequest(kind="refuse")
    grpcio, ours = both(path, lambda s: s.SubmitChange(request, timeout=5))
    assert ours == grpcio == ("INVALID_ARGUMENT", "kind 'refuse': naïve → refused 100%")


def test_a_method_the_server_lacks_is_unimplemented(
    served: tuple[str, Servicer, grpc.Server],
) -> None:
    path, _, _ = served
    grpcio, ours = both(path, lambda s: s.Doctor(admin_pb2.DoctorRequest(), timeout=5))
    assert ours == grpcio
    assert ours[0] == "UNIMPLEMENTED"


def test_a_deadline_ends_the_call_and_the_connection_stays_usable(
    served: tuple[str, Servicer, grpc.Server],
) -> None:
    path, _, _ = served
    slow = admin_pb2.SubmitChangeRequest(kind="slow")
    grpcio, ours = both(path, lambda s: s.SubmitChange(slow, timeout=0.3))
    assert ours == grpcio == ("DEADLINE_EXCEEDED", "Deadline Exceeded")
    with ironctl_stub(path) as stub:
        with pytest.raises(wire.RpcError) as caught:
            stub.SubmitChange(slow, timeout=0.3)
        assert caught.value.code() == wire.StatusCode.DEADLINE_EXCEEDED
        assert stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=5).pid == 42


def test_messages_larger_than_the_windows_go_both_ways(
    served: tuple[str, Servicer, grpc.Server],
) -> None:
    path, servicer, _ = served
    request = admin_pb2.SubmitChangeRequest(kind="k", payload_json="p" * BIG, reason="big")
    grpcio, ours = both(path, lambda s: s.SubmitChange(request, timeout=10).change.id)
    assert ours == grpcio == ("OK", "big")
    assert servicer.received == [BIG, BIG]
    listed = admin_pb2.ListAuditRequest(limit=1)
    grpcio, ours = both(path, lambda s: len(s.ListAudit(listed, timeout=10).records[0]))
    assert ours == grpcio == ("OK", BIG)
    # More than the whole connection's window on one connection: what came is acknowledged.
    with ironctl_stub(path) as stub:
        for _ in range(4):
            assert len(stub.ListAudit(listed, timeout=10).records[0]) == BIG


def test_a_response_over_4_mib_is_refused_as_grpcio_refuses_it(
    served: tuple[str, Servicer, grpc.Server],
) -> None:
    path, _, _ = served
    listed = admin_pb2.ListAuditRequest(limit=2)
    grpcio, ours = both(path, lambda s: s.ListAudit(listed, timeout=10))
    assert ours[0] == grpcio[0] == "RESOURCE_EXHAUSTED"
    assert ours[1].startswith("Received message larger than max (")


def test_a_stream_yields_every_message_then_its_status(
    served: tuple[str, Servicer, grpc.Server],
) -> None:
    path, _, _ = served
    done = admin_pb2.WatchRepliesRequest(sid="s")
    grpcio, ours = both(path, lambda s: [i.reply.seq for i in s.WatchReplies(done, timeout=5)])
    assert ours == grpcio == ("OK", [1, 2, 3])
    failing = admin_pb2.WatchRepliesRequest(sid="fail")
    seen: list[int] = []

    def collect(stub: Any) -> None:
        seen.extend(i.reply.seq for i in stub.WatchReplies(failing, timeout=5))

    grpcio, ours = both(path, collect)
    assert ours == grpcio == ("NOT_FOUND", "session fail: no such session")
    assert seen == [1, 2, 3, 1, 2, 3]


def test_a_stream_left_early_is_cancelled_and_the_next_call_is_answered(
    served: tuple[str, Servicer, grpc.Server],
) -> None:
    path, servicer, _ = served
    with ironctl_stub(path) as stub:
        replies = stub.WatchReplies(admin_pb2.WatchRepliesRequest(sid="s", follow=True), timeout=30)
        assert next(replies).reply.seq == 1
        replies.close()  # as ironctl does once it has the reply it waited for
        assert stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=5).state == "ready"
        assert servicer.watch_ended.wait(5), "the server still streams to a call that was left"


def test_no_server_is_unavailable(tmp_path: Path) -> None:
    missing = str(tmp_path / "none.sock")
    grpcio, ours = both(missing, lambda s: s.GetStatus(admin_pb2.GetStatusRequest(), timeout=5))
    assert ours[0] == grpcio[0] == "UNAVAILABLE"
    assert "No such file or directory" in ours[1]


def test_a_server_that_goes_away_mid_stream_is_unavailable(
    served: tuple[str, Servicer, grpc.Server],
) -> None:
    path, _, server = served
    with ironctl_stub(path) as stub:
        replies = stub.WatchReplies(admin_pb2.WatchRepliesRequest(sid="s", follow=True), timeout=30)
        assert next(replies).reply.seq == 1
        server.stop(None)
        with pytest.raises(wire.RpcError) as caught:
            list(replies)
        assert caught.value.code() in (wire.StatusCode.UNAVAILABLE, wire.StatusCode.CANCELLED)


@pytest.mark.parametrize(
    ("seconds", "header"),
    [(0.0001, "1m"), (2.5, "2500m"), (86400.0, "86400000m"), (10**6, "1000000S")],
)
def test_the_timeout_header(seconds: float, header: str) -> None:
    assert wire.timeout_header(seconds) == header


def test_a_connection_the_server_closed_between_calls_is_replaced(tmp_path: Path) -> None:
    """As grpcio's client does: the server closes a connection idle for 0.2 s (a GOAWAY, then
    the end); the next call on the channel opens a new one (ironctl chat waits at its prompt)."""
    path = str(tmp_path / "idle.sock")
    idle = [("grpc.max_connection_idle_ms", 200)]
    server = serve(path, Servicer(), idle)  # type: ignore[abstract]
    try:

        def twice(stub: Any) -> list[int]:
            first = stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=5).pid
            time.sleep(1.0)
            return [first, stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=5).pid]

        grpcio, ours = both(path, twice)
        assert ours == grpcio == ("OK", [42, 42])
    finally:
        server.stop(None)


# -- who holds the socket ----------------------------------------------------------------------

STRANGER = 1000 if os.geteuid() != 1000 else 1001


def held_by(monkeypatch: pytest.MonkeyPatch, uid: int) -> None:
    """The kernel's answer to getsockopt(SO_PEERCRED), as if ``uid`` held the socket (no chown
    in the unit tier)."""
    real = socket.socket.getsockopt

    def getsockopt(self: socket.socket, level: int, name: int, *rest: Any) -> Any:
        if level == socket.SOL_SOCKET and name == socket.SO_PEERCRED:
            return struct.pack("3i", 4242, uid, uid)
        return real(self, level, name, *rest)

    monkeypatch.setattr(socket.socket, "getsockopt", getsockopt)


def test_a_socket_another_user_holds_is_sent_nothing(
    served: tuple[str, Servicer, grpc.Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, servicer, _ = served
    held_by(monkeypatch, STRANGER)
    secret = admin_pb2.SubmitChangeRequest(kind="persona", payload_json='{"persona": "hunter2"}')
    with ironctl_stub(path) as stub, pytest.raises(wire.RpcError) as caught:
        stub.SubmitChange(secret, timeout=5)
    assert servicer.received == []
    assert caught.value.code() == wire.StatusCode.PERMISSION_DENIED
    assert caught.value.details() == (
        f"unix:{path} is served by uid {STRANGER}, neither root (ironclawd) nor you "
        f"(uid {os.geteuid()}): nothing was sent to it; check --socket and IRONCLAW_ADMIN_SOCKET"
    )


@pytest.mark.parametrize("argv", [["status"], ["api", "list"]], ids=["wire", "grpcio"])
def test_ironctl_refuses_another_users_socket_with_exit_4(
    served: tuple[str, Servicer, grpc.Server],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    path, _, _ = served
    held_by(monkeypatch, STRANGER)
    assert main([*argv, "--socket", path, "--json"]) == exitcodes.PERMISSION
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == "PERMISSION_DENIED"
    assert f"is served by uid {STRANGER}" in error["message"]


def test_a_socket_root_holds_is_ironclawds(
    served: tuple[str, Servicer, grpc.Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _, _ = served
    held_by(monkeypatch, 0)
    with ironctl_stub(path) as stub:
        assert stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=5).pid == 42


# -- a server that keeps sending between calls ---------------------------------------------------

PING = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"12345678"  # an HTTP/2 PING frame, 17 bytes


def answer_one_call(sock: socket.socket) -> None:
    """Serve one GetStatus on a new connection, as grpcio would (h2's server side)."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    while True:
        data = sock.recv(65536)
        if not data:
            return
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.StreamEnded):
                body = admin_pb2.GetStatusResponse(pid=42).SerializeToString()
                headers = [(":status", "200"), ("content-type", "application/grpc")]
                conn.send_headers(event.stream_id, headers)
                conn.send_data(event.stream_id, struct.pack(">BI", 0, len(body)) + body)
                conn.send_headers(event.stream_id, [("grpc-status", "0")], end_stream=True)
                sock.sendall(conn.data_to_send())
                return
        sock.sendall(conn.data_to_send())


def flooding_daemon(listener: socket.socket, stop: threading.Event) -> None:
    """Answers the first call, then sends PINGs without end and never reads that connection
    again; a connection after it is answered as usual (in a thread of its own)."""
    first, _ = listener.accept()
    answer_one_call(first)

    def answer_the_next() -> None:
        with contextlib.suppress(OSError):
            second, _ = listener.accept()
            with second:
                second.settimeout(5)
                answer_one_call(second)

    threading.Thread(target=answer_the_next, daemon=True).start()
    first.settimeout(0.2)
    while not stop.is_set():
        with contextlib.suppress(OSError):
            first.sendall(PING * 512)
    first.close()


def test_a_flood_between_calls_does_not_outlast_the_next_calls_deadline(tmp_path: Path) -> None:
    # Before, the next call drained what came meanwhile with no deadline, and sent the PING
    # acks with a blocking sendall: held for ever by a server that keeps sending, not reading.
    path = str(tmp_path / "flood.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(2)
        stop = threading.Event()
        server = threading.Thread(target=flooding_daemon, args=(listener, stop), daemon=True)
        server.start()
        outcome: list[Any] = []

        def two_calls() -> None:
            with ironctl_stub(path) as stub:
                outcome.append(stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=5).pid)
                time.sleep(0.2)  # the flood fills both ways meanwhile
                try:
                    outcome.append(stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=1).pid)
                except wire.RpcError as err:
                    outcome.append(err.code().name)

        client = threading.Thread(target=two_calls, daemon=True)
        client.start()
        client.join(10)
        hung = client.is_alive()
        stop.set()
        server.join(5)
        client.join(5)
    assert not hung, "the second call (timeout 1 s) was still waiting after 10 s"
    # Answered on a new connection (the flooded one dropped), or out of time: never held.
    assert outcome[0] == 42
    assert outcome[1] in (42, "DEADLINE_EXCEEDED")
