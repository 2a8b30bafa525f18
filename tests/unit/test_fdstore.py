"""The fd store adapter (ironclawd/host/fdstore.py) against a real notification socket standing
in for systemd's ($NOTIFY_SOCKET, a Unix datagram socket): what it sends, the descriptors that
come with it, and the barrier (systemd closes the pipe end it was sent). The real store, with a
real systemd, is exercised by the integration tier's restart test."""

from __future__ import annotations

import array
import os
import resource
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ironclawd.host.fdstore import SystemdFdStore, check_name

HIGH = 1500


@pytest.fixture
def notify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    sock.bind(str(path))
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield sock
    sock.close()


def receive(sock: socket.socket) -> tuple[str, list[int]]:
    fds = array.array("i")
    data, ancdata, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(16 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data.decode(), list(fds)


def test_put_sends_the_name_and_a_copy_of_the_descriptor(notify: socket.socket) -> None:
    a, b = socket.socketpair()
    assert SystemdFdStore().put("control.keep0001", [a.fileno()])
    text, fds = receive(notify)
    assert text == "FDSTORE=1\nFDNAME=control.keep0001"
    assert len(fds) == 1
    copy = socket.socket(fileno=fds[0])
    copy.sendall(b"x")  # the copy is the same socket: what it sends, b receives
    assert b.recv(1) == b"x"
    for s in (a, b, copy):
        s.close()


def test_drop_names_what_to_remove(notify: socket.socket) -> None:
    SystemdFdStore().drop("control.keep0001")
    assert receive(notify) == ("FDSTOREREMOVE=1\nFDNAME=control.keep0001", [])


def test_the_barrier_returns_once_the_pipe_is_closed_even_above_fd_setsize(
    notify: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With hundreds of sessions the daemon's descriptors pass 1024, where select() fails: the
    # barrier's pipe is given numbers above it.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= HIGH + 1:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    real_pipe2 = os.pipe2

    def high_pipe2(flags: int) -> tuple[int, int]:
        low = real_pipe2(flags)
        high = (os.dup2(low[0], HIGH), os.dup2(low[1], HIGH + 1))
        for fd in low:
            os.close(fd)
        return high

    monkeypatch.setattr(os, "pipe2", high_pipe2)

    def systemd() -> None:
        text, fds = receive(notify)
        assert text == "BARRIER=1"
        for fd in fds:
            os.close(fd)

    peer = threading.Thread(target=systemd)
    peer.start()
    try:
        assert SystemdFdStore().barrier(5.0)
    finally:
        peer.join(5)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_without_systemd_nothing_is_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    a, b = socket.socketpair()
    store = SystemdFdStore()
    assert not store.put("control.keep0001", [a.fileno()])
    assert not store.barrier(0.1)
    assert store.take() == {}
    a.close()
    b.close()


@pytest.mark.parametrize("name", ["", "a:b", "x" * 256, "tab\there", "é"])
def test_a_name_systemd_would_refuse_is_refused_here(name: str) -> None:
    with pytest.raises(ValueError, match="fd store name"):
        check_name(name)
