"""The admin socket ironctl checked is the one it talks to, when the --socket name changes
meanwhile: a symlink in sticky /tmp that another user owns and flips, the very case the peer
check (ctl/wire.py open_admin_socket) is for. ``ironctl api`` hands grpcio a socket to connect
by itself; ironctl's own channel checks each connection it makes, a reconnect too.

The kernel is faked as in test_ctl_wire.py (no chown in the unit tier): SO_PEERCRED says the
socket bound as ``evil.sock`` is held by another user, any other by this one."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_reflection.v1alpha import reflection

from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from ironclawd.ctl import api, exitcodes, wire
from ironclawd.ctl.main import main
from tests.unit.test_ctl_wire import STRANGER, Servicer, answer_one_call, ironctl_stub

SECRET = '{"persona": "hunter2"}'
CALL = ["api", "call", "SubmitChange", json.dumps({"kind": "persona", "payload_json": SECRET})]


class Daemon:
    """A gRPC server with reflection on ``path``: ironclawd's, or the other user's."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.servicer = Servicer()  # type: ignore[abstract]  # (the rest: UNIMPLEMENTED)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        admin_pb2_grpc.add_AdminServiceServicer_to_server(self.servicer, self.server)
        names = ("ironclaw.admin.v1.AdminService", reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.server)
        self.server.add_insecure_port(f"unix:{path}")
        self.server.start()


@pytest.fixture
def daemons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Daemon, Daemon]]:
    """(ironclawd's, held by this user; the other user's, at ``evil.sock``)."""
    real = socket.socket.getsockopt

    def getsockopt(self: socket.socket, level: int, name: int, *rest: Any) -> Any:
        peercred = level == socket.SOL_SOCKET and name == socket.SO_PEERCRED
        if peercred and str(self.getpeername()).endswith("evil.sock"):
            return struct.pack("3i", 4242, STRANGER, STRANGER)
        return real(self, level, name, *rest)

    monkeypatch.setattr(socket.socket, "getsockopt", getsockopt)
    ours, theirs = Daemon(tmp_path / "admin.sock"), Daemon(tmp_path / "evil.sock")
    yield ours, theirs
    ours.server.stop(None)
    theirs.server.stop(None)


def point(link: Path, to: Path) -> None:
    """The link's owner's move: ``link`` names ``to`` from now on (rename(2), atomic)."""
    new = link.with_name(link.name + ".new")
    new.symlink_to(to)
    os.replace(new, link)


def test_ironctl_api_sends_nothing_to_a_socket_swapped_in_after_the_check(
    daemons: tuple[Daemon, Daemon],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: the check connected to the name and grpcio to the name again, at its first call,
    # so the request went to whatever the name said by then: the other user's socket.
    ours, theirs = daemons
    link = tmp_path / "ic.sock"
    link.symlink_to(ours.path)
    opened = api.open_reflection

    def flipped_once_checked(path: str, timeout: float | None = None) -> api.Reflected:
        reflected = opened(path, timeout)  # checked: ironclawd's
        point(link, theirs.path)  # before grpcio's first connect
        return reflected

    monkeypatch.setattr(api, "open_reflection", flipped_once_checked)
    assert main([*CALL, "--socket", str(link), "--json", "--timeout", "5"]) == exitcodes.OK
    assert theirs.servicer.received == []
    assert ours.servicer.received == [len(SECRET)]
    assert "change" in json.loads(capsys.readouterr().out)


def test_ironctl_api_checks_the_socket_it_pinned_not_the_name(
    daemons: tuple[Daemon, Daemon],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The other order: the name names the other user's socket when ironctl pins it, then
    # ironclawd's when a check by name would look. The check is of what grpcio will reach.
    ours, theirs = daemons
    link = tmp_path / "ic.sock"
    link.symlink_to(theirs.path)
    real_open = os.open

    def open_then_flip(path: Any, flags: int, *rest: Any, **kwargs: Any) -> int:
        fd = real_open(path, flags, *rest, **kwargs)
        if str(path) == str(link):
            point(link, ours.path)
        return fd

    monkeypatch.setattr(os, "open", open_then_flip)
    assert main([*CALL, "--socket", str(link), "--json", "--timeout", "5"]) == exitcodes.PERMISSION
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == "PERMISSION_DENIED"
    assert error["message"].startswith(f"unix:{link} is served by uid {STRANGER}, ")
    assert theirs.servicer.received == ours.servicer.received == []


def test_a_pinned_socket_that_is_gone_is_unavailable_and_names_the_socket(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    link = tmp_path / "ic.sock"
    link.symlink_to(tmp_path / "admin.sock")  # nobody there
    assert main(["api", "list", "--socket", str(link), "--json", "--timeout", "5"]) == (
        exitcodes.UNAVAILABLE
    )
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == "UNAVAILABLE"
    assert error["message"] == (
        f"connect to unix:{link}: No such file or directory; {link} does not exist: is "
        f"ironclawd running? (systemctl status ironclawd; ironctl used --socket {link})"
    )


def test_a_reconnect_checks_the_socket_the_name_now_names(
    daemons: tuple[Daemon, Daemon], tmp_path: Path
) -> None:
    # ironctl's own channel (ctl/wire.py) looks the name up again for a new connection (a
    # restarted ironclawd is found); the check is made again on that connection.
    _, theirs = daemons
    link = tmp_path / "ic.sock"
    first = tmp_path / "first.sock"  # ironclawd's, which ends the connection after one call
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(first))
        listener.listen(1)
        link.symlink_to(first)

        answered = threading.Event()

        def serve_one() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(5)
                answer_one_call(conn)
                answered.wait(5)

        server = threading.Thread(target=serve_one, daemon=True)
        server.start()
        with ironctl_stub(str(link)) as stub:
            assert stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=5).pid == 42
            answered.set()
            server.join(5)  # its end of the connection is closed
            point(link, theirs.path)
            secret = admin_pb2.SubmitChangeRequest(kind="persona", payload_json=SECRET)
            with pytest.raises(wire.RpcError) as caught:
                stub.SubmitChange(secret, timeout=5)
    assert caught.value.code() == wire.StatusCode.PERMISSION_DENIED
    assert f"unix:{link} is served by uid {STRANGER}" in caught.value.details()
    assert theirs.servicer.received == []
