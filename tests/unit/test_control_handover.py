"""Handing the control sockets over a daemon restart (ironclawd/api/control.py ``hand_over`` and
``restore``), over real Unix sockets, with ``os.dup`` in the place of systemd's fd store (the
integration tier does it with the real store and a real sandbox): the agent's connection never
ends, what it wrote meanwhile is read, the new server answers on the same listener, and nothing
that is not ours is used."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from ironclawd.api import control
from ironclawd.api.control import ControlServer
from ironclawd.host import fdstore
from ironclawd.ports import RESYNC

SID = "keep0001"


def _bind(path: Path, *, mode: int, group: str | None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(8)
    sock.setblocking(False)
    return sock


@pytest.fixture(autouse=True)
def no_root_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parts that need root (a root-owned directory, chown) and a sandbox unit (the peer's
    cgroup) are stood in for; everything on the sockets is real."""
    monkeypatch.setattr(control, "ensure_private_dir", lambda path, mode: path.mkdir(exist_ok=True))
    monkeypatch.setattr(control, "bind_unix_socket", _bind)
    monkeypatch.setattr(control, "peer_in_unit", lambda sock, unit: True)


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int]] = []
        self.changed = asyncio.Event()

    async def __call__(self, sid: str, event: str, value: int) -> None:
        self.seen.append((sid, event, value))
        self.changed.set()

    async def wait_for(self, item: tuple[str, str, int]) -> None:
        async with asyncio.timeout(5):
            while item not in self.seen:
                self.changed.clear()
                await self.changed.wait()


def store_copy(handed: list[tuple[str, list[int]]]) -> dict[str, list[socket.socket]]:
    """What systemd would give the next run: its own copies, by name."""
    return {name: [socket.socket(fileno=os.dup(fd)) for fd in fds] for name, fds in handed}


async def agent_connect(path: Path, hello: bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    sock.sendall(hello)
    sock.setblocking(False)
    return sock


async def recv_line(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    return await asyncio.wait_for(loop.sock_recv(sock, 100), 5)


def still_open(sock: socket.socket) -> bool:
    try:
        return sock.recv(100) != b""
    except BlockingIOError:
        return True


def run(body: Callable[[Path], Coroutine[Any, Any, None]], tmp_path: Path) -> None:
    asyncio.run(body(tmp_path))


def test_the_agents_connection_outlives_a_restart_and_what_it_wrote_meanwhile_is_read(
    tmp_path: Path,
) -> None:
    async def body(root: Path) -> None:
        old, old_events = ControlServer(root), Events()
        old.set_listener(old_events)
        directory = await old.open(SID)
        path = directory / control.CONTROL_SOCKET
        agent = await agent_connect(path, b"hello 7 10000 2\n")
        assert (await old.wait_hello(SID)).pid == 7
        await old_events.wait_for((SID, "outbound", 2))

        handed = await old.hand_over()
        assert sorted(name for name, _ in handed) == [f"control.{SID}", f"control.{SID}.7.10000"]
        taken = store_copy(handed)
        await old.close_all_listeners()
        assert still_open(agent), "the agent saw its connection end"
        agent.sendall(b"outbound 3\n")  # written while no daemon runs

        new, events = ControlServer(root), Events()
        new.set_listener(events)
        assert new.restore(taken) == 1
        await new.open(SID)
        hello = await new.wait_hello(SID)
        assert (hello.pid, hello.uid) == (7, 10000)
        await events.wait_for((SID, "outbound", 3))  # the line from the gap is read
        assert (SID, RESYNC, 0) not in events.seen  # nothing was in hand: no full read
        # The new daemon's first line: the agent's gRPC connections ended with the old one.
        assert await recv_line(agent) == control.RESTARTED_LINE == b"restarted 0\n"
        assert await new.send(SID, "inbound", 9)
        assert await recv_line(agent) == b"inbound 9\n"
        # The listener is the one the path names: a new connection reaches the new server.
        other = await agent_connect(path, b"hello 8 10000\n")
        await asyncio.sleep(0.05)
        assert still_open(other)
        other.close()
        agent.close()
        await new.close_all_listeners()

    run(body, tmp_path)


def test_a_line_read_but_not_acted_on_at_the_stop_makes_the_next_daemon_read_again(
    tmp_path: Path,
) -> None:
    async def body(root: Path) -> None:
        acting, release = asyncio.Event(), asyncio.Event()

        async def slow(sid: str, event: str, value: int) -> None:
            acting.set()
            await release.wait()  # the stop comes while this line is being acted on

        old = ControlServer(root)
        old.set_listener(slow)
        path = await old.open(SID) / control.CONTROL_SOCKET
        agent = await agent_connect(path, b"hello 7 10000\n")
        await old.wait_hello(SID)
        agent.sendall(b"outbound 3\n")
        await asyncio.wait_for(acting.wait(), 5)
        handed = await old.hand_over()
        assert f"control.{SID}.7.10000.resync" in [name for name, _ in handed]
        taken = store_copy(handed)
        release.set()
        await old.close_all_listeners()

        new, events = ControlServer(root), Events()
        new.set_listener(events)
        assert new.restore(taken) == 1
        await new.open(SID)
        await events.wait_for((SID, RESYNC, 0))
        agent.close()
        await new.close_all_listeners()

    run(body, tmp_path)


def test_a_session_whose_replies_are_not_all_taken_is_read_in_full_by_the_next_daemon(
    tmp_path: Path,
) -> None:
    """A session held at a reply bound (or whose replies a full state DB did not take) has
    replies its agent announced once: the next daemon reads its queue in full, so a bound raised
    across a restart takes them, and the hold is known again, without waiting for another."""

    async def body(root: Path) -> None:
        old = ControlServer(root)
        old.set_listener(Events())
        old.set_unsettled(lambda sid: sid == SID)
        path = await old.open(SID) / control.CONTROL_SOCKET
        agent = await agent_connect(path, b"hello 7 10000 5\n")
        await old.wait_hello(SID)
        handed = await old.hand_over()
        assert f"control.{SID}.7.10000.resync" in [name for name, _ in handed]
        taken = store_copy(handed)
        await old.close_all_listeners()

        new, events = ControlServer(root), Events()
        new.set_listener(events)
        assert new.restore(taken) == 1
        await new.open(SID)
        await events.wait_for((SID, RESYNC, 0))
        agent.close()
        await new.close_all_listeners()

    run(body, tmp_path)


def test_what_is_not_ours_is_closed_and_never_used(tmp_path: Path) -> None:
    async def body(root: Path) -> None:
        (root / SID).mkdir()
        stranger_a, stranger_b = socket.socketpair()
        elsewhere = _bind(root / "elsewhere.sock", mode=0o666, group=None)
        server = ControlServer(root)
        restored = server.restore(
            {
                "something.else": [stranger_a],
                f"control.{SID}.x.y": [stranger_b],  # not a pid and uid
                f"control.{SID}": [elsewhere],  # a listener bound at another path
            }
        )
        assert restored == 0
        assert stranger_a.fileno() == -1
        assert stranger_b.fileno() == -1
        await server.open(SID)
        assert elsewhere.fileno() == -1, "a listener at another path was used"
        assert (root / SID / control.CONTROL_SOCKET).exists()
        await server.close_all_listeners()

    run(body, tmp_path)


def test_a_stop_before_a_restored_session_was_opened_hands_it_on(tmp_path: Path) -> None:
    async def body(root: Path) -> None:
        ours, theirs = socket.socketpair()
        server = ControlServer(root)
        server.restore({f"control.{SID}.7.10000": [ours]})
        assert await server.hand_over() == [(f"control.{SID}.7.10000", [ours.fileno()])]
        theirs.close()
        server.discard_restored()

    run(body, tmp_path)


def test_restored_but_never_opened_is_closed_by_discard(tmp_path: Path) -> None:
    async def body(root: Path) -> None:
        ours, theirs = socket.socketpair()
        server = ControlServer(root)
        assert server.restore({f"control.{SID}.7.10000": [ours]}) == 1
        server.discard_restored()  # the session was removed while the daemon was down
        assert ours.fileno() == -1
        theirs.setblocking(False)
        assert not still_open(theirs)
        theirs.close()

    run(body, tmp_path)


def test_a_restored_connection_from_outside_the_unit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(root: Path) -> None:
        ours, theirs = socket.socketpair()
        monkeypatch.setattr(control, "peer_in_unit", lambda sock, unit: False)
        server = ControlServer(root)
        server.restore({f"control.{SID}.7.10000": [ours]})
        await server.open(SID)
        theirs.setblocking(False)
        for _ in range(50):
            await asyncio.sleep(0.01)
            if not still_open(theirs):
                break
        assert not still_open(theirs)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(server.wait_hello(SID), 0.05)
        theirs.close()
        await server.close_all_listeners()

    run(body, tmp_path)


@pytest.mark.parametrize(
    "line",
    [
        b"hello " + b"9" * 240 + b" 0\n",  # under MAX_LINE, but no fd store name could hold it
        b"hello 7 " + b"1" * 11 + b"\n",
        b"hello 7 1000 " + b"1" * 20 + b"\n",
        b"hello -5 1000\n",
        b"hello +5 1000\n",
        b"hello 1_0 1000\n",
        b"hello 7 1000 -1\n",
    ],
)
def test_a_hello_whose_numbers_are_not_plain_and_bounded_is_refused(line: bytes) -> None:
    with pytest.raises(ValueError, match="expected 'hello <pid> <uid>"):
        control._parse_hello(line)


def test_an_outbound_seq_that_is_not_plain_and_bounded_is_refused() -> None:
    assert control._parse_event(b"outbound " + b"9" * 19 + b"\n") == ("outbound", int("9" * 19))
    for line in (b"outbound " + b"9" * 20 + b"\n", b"outbound 1_0\n", b"outbound +1\n"):
        with pytest.raises(ValueError, match="expected 'outbound <seq>'"):
            control._parse_event(line)


def test_a_box_cannot_make_a_name_the_fd_store_refuses(tmp_path: Path) -> None:
    """A hello of 240 digits once named its connection past the store's 255 characters, and
    ``put_all`` refused the whole hand-over: every session's agent lost its connection."""

    async def body(root: Path) -> None:
        server = ControlServer(root)
        for sid in (SID, "keep0002"):
            await server.open(sid)
        good = await agent_connect(root / "keep0002" / control.CONTROL_SOCKET, b"hello 7 1000\n")
        big = b"hello " + b"9" * 240 + b" 0\n"
        assert len(big) < control.MAX_LINE
        bad = await agent_connect(root / SID / control.CONTROL_SOCKET, big)
        await server.wait_hello("keep0002")
        handed = await server.hand_over()
        assert sorted(name for name, _ in handed) == [
            f"control.{SID}",
            "control.keep0002",
            "control.keep0002.7.1000",
        ]
        for name, _ in handed:
            fdstore.check_name(name)
        assert not still_open(bad)  # refused at its hello
        good.close()
        bad.close()
        await server.close_all_listeners()

    run(body, tmp_path)


def test_a_connection_that_ends_while_the_hand_over_waits_is_left_out(tmp_path: Path) -> None:
    """``hand_over`` lets lines in hand finish over two turns of the loop; a connection whose
    task ends meanwhile (its agent closed it) is not handed over, and the rest are."""

    async def body(root: Path) -> None:
        gate, entered = asyncio.Event(), asyncio.Event()

        async def acting(sid: str, event: str, value: int) -> None:
            entered.set()
            await gate.wait()

        server = ControlServer(root)
        server.set_listener(acting)
        path = await server.open(SID) / control.CONTROL_SOCKET
        agent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        agent.connect(str(path))
        agent.sendall(b"hello 7 1000 5\n")  # outbound 5: the daemon acts on it at once
        await asyncio.wait_for(entered.wait(), 5)
        agent.shutdown(socket.SHUT_WR)  # then the agent ends its side
        await asyncio.sleep(0.05)  # the end is read into the connection's reader
        task = asyncio.create_task(server.hand_over())
        await asyncio.sleep(0)  # hand_over took the connection and waits its two turns
        gate.set()  # the action finishes within them, and the task lets go of the connection
        handed = await asyncio.wait_for(task, 5)
        assert [name for name, _ in handed] == [f"control.{SID}"]
        agent.close()
        await server.close_all_listeners()

    run(body, tmp_path)


def test_a_session_settled_while_others_are_adopted_gets_a_new_listener(tmp_path: Path) -> None:
    """What the fd store gave back for a session goes with it when it is torn down (its
    sandbox died while the daemon was down): started again before the adoption of the others
    is over, it listens on a new socket at the path, not on the old one whose file is gone."""

    async def body(root: Path) -> None:
        old = ControlServer(root)
        await old.open(SID)
        taken = store_copy(await old.hand_over())
        await old.close_all_listeners()

        new = ControlServer(root)
        new.restore(taken)
        await new.close(SID)  # teardown of the settled session
        assert not (root / SID).exists()
        for socks in taken.values():
            assert all(sock.fileno() == -1 for sock in socks)
        path = await new.open(SID) / control.CONTROL_SOCKET  # started again
        agent = await agent_connect(path, b"hello 7 1000\n")
        assert (await asyncio.wait_for(new.wait_hello(SID), 5)).pid == 7
        agent.close()
        await new.close_all_listeners()

    run(body, tmp_path)
