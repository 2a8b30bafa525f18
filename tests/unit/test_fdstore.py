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

import pytest
from systemd import daemon as sd_daemon

from ironclawd.host.fdstore import (
    BUNDLE,
    SystemdFdStore,
    _messages,
    bundle,
    check_name,
    unbundle,
)

HIGH = 1500


def receive(sock: socket.socket) -> tuple[str, list[int]]:
    fds = array.array("i")
    data, ancdata, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(300 * fds.itemsize))
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


def _pairs(count: int) -> list[tuple[socket.socket, socket.socket]]:
    return [socket.socketpair() for _ in range(count)]


def _same_socket(copy: socket.socket, peer: socket.socket) -> bool:
    copy.sendall(b"x")  # what the copy sends, the original's peer receives
    return peer.recv(1) == b"x"


@pytest.mark.parametrize(("count", "bundles"), [(600, 1), (2100, 2)])
def test_put_all_stores_a_descriptor_per_2024(
    notify: socket.socket, count: int, bundles: int
) -> None:
    """600 sockets (three messages of at most 253) reach systemd as one stored descriptor, 2100
    (nine messages) as two, each with FDPOLL=0; taken back, each name has its own socket again,
    in order."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 5 * count + 256  # both ends, the copies taken back, and what pytest holds
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(need, soft), max(need, hard)))
    except (ValueError, OSError):  # not root: as far as the hard limit goes
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    pairs = _pairs(count)
    try:
        entries = [(f"control.s{i:04d}", [a.fileno()]) for i, (a, _b) in enumerate(pairs)]
        assert SystemdFdStore().put_all(entries)
        stored = [receive(notify) for _ in range(bundles)]
        assert [text for text, _ in stored] == [
            f"FDSTORE=1\nFDNAME={BUNDLE}{n}\nFDPOLL=0" for n in range(bundles)
        ]
        assert all(len(fds) == 1 for _, fds in stored)
        for a, _b in pairs:
            a.close()  # the daemon closes its own copies: the bundles keep them open
        taken: dict[str, list[socket.socket]] = {}
        for _, (fd,) in stored:
            with socket.socket(fileno=fd) as held:
                taken.update(unbundle(held))
        assert list(taken) == [name for name, _ in entries]
        for i, (_a, b) in enumerate(pairs):
            (copy,) = taken[f"control.s{i:04d}"]
            assert _same_socket(copy, b)
            copy.close()
    finally:
        for a, b in pairs:
            a.close()
            b.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_take_reads_the_bundle_and_what_older_versions_stored_one_by_one(
    notify: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    (a, b), (c, d) = _pairs(2)
    held = bundle(_messages([("control.new00001", [a.fileno()])]))
    old = socket.socket(fileno=os.dup(c.fileno()))  # as an older daemon stored it
    listed = {held.detach(): f"{BUNDLE}0", old.detach(): "control.old00001"}
    monkeypatch.setattr(sd_daemon, "listen_fds_with_names", lambda **_kw: listed)
    taken = SystemdFdStore().take()
    assert sorted(taken) == ["control.new00001", "control.old00001"]
    assert _same_socket(taken["control.new00001"][0], b)
    assert _same_socket(taken["control.old00001"][0], d)
    dropped = sorted(receive(notify)[0] for _ in range(2))
    assert dropped == [f"FDSTOREREMOVE=1\nFDNAME={name}" for name in sorted(listed.values())]
    for sock in (a, b, c, d, *(s for socks in taken.values() for s in socks)):
        sock.close()


def test_a_bundle_message_that_is_not_ours_is_closed_and_the_rest_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    (a, b), (c, d) = _pairs(2)
    reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    socket.send_fds(writer, [b'[["control.x", 2]]'], [c.fileno()])  # counts do not add up
    socket.send_fds(writer, [b"not json"], [c.fileno()])
    socket.send_fds(writer, [b'[["control.good0001", 1]]'], [a.fileno()])
    writer.close()
    c.close()
    taken = unbundle(reader)
    reader.close()
    assert list(taken) == ["control.good0001"]
    assert _same_socket(taken["control.good0001"][0], b)
    assert caplog.text.count("was not ours or was cut short: closed") == 2
    d.settimeout(2)
    assert d.recv(1) == b""  # every copy of c is closed: its peer sees the end
    for sock in (a, b, d, taken["control.good0001"][0]):
        sock.close()


def test_put_all_refuses_a_name_or_a_count_systemd_would_refuse(notify: socket.socket) -> None:
    a, b = socket.socketpair()
    with pytest.raises(ValueError, match="fd store name"):
        SystemdFdStore().put_all([("a:b", [a.fileno()])])
    with pytest.raises(ValueError, match="expected 1-253"):
        SystemdFdStore().put_all([("control.x", [a.fileno()] * 254)])
    a.close()
    b.close()
