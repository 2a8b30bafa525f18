"""The control socket's limits (ironclawd/api/control.py), over real socket pairs: a full socket
drops the oldest connection still waiting for its hello and never the agent's; a peer that stops
reading cannot hold up the session's messages; an extra connection that says hello and leaves is
not the sandbox exiting."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest

from ironclawd.api import control
from ironclawd.api.control import ControlServer, _Channel
from ironclawd.config import SocketsConfig

LIMITS = SocketsConfig(max_control_connections=3, handshake_timeout_seconds=5.0)


class Box:
    """A session's control socket, served from socket pairs (no filesystem, no cgroup)."""

    def __init__(self) -> None:
        self.server = ControlServer(Path("/nonexistent"), LIMITS)
        self.channel = _Channel(cast(Any, None), asyncio.get_running_loop().create_future())
        self.server._channels["s1"] = self.channel
        self.tasks: list[asyncio.Task[None]] = []
        self.peers: list[socket.socket] = []

    async def connect(self, first: bytes = b"") -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        self.tasks.append(
            asyncio.create_task(self.server._serve("s1", self.channel, reader, writer))
        )
        self.peers.append(theirs)
        theirs.setblocking(False)
        if first:
            theirs.send(first)
        for _ in range(20):  # let the server take the connection and read what was sent
            await asyncio.sleep(0)
        return theirs


@pytest.fixture
def in_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control, "peer_in_unit", lambda sock, unit: True)


def closed(sock: socket.socket) -> bool:
    try:
        while sock.recv(4096):
            pass
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    return True


async def run(body: Callable[[Box], Awaitable[None]]) -> None:
    box = Box()
    try:
        await body(box)
    finally:
        for task in box.tasks:
            task.cancel()
        await asyncio.gather(*box.tasks, return_exceptions=True)
        for peer in box.peers:
            peer.close()


def test_a_full_socket_drops_the_oldest_waiting_connection_never_the_agents(in_unit: None) -> None:
    async def body(box: Box) -> None:
        agent = await box.connect(b"hello 7 10000\n")
        assert box.channel.hello.done()
        assert box.channel.hello.result().pid == 7
        waiting = [await box.connect() for _ in range(2)]
        late = await box.connect()  # the socket is full: the oldest waiting one goes
        assert [closed(s) for s in waiting] == [True, False]
        assert not closed(late)
        assert not closed(agent)
        # Two more that say hello fill it with connections that all said hello: the next is
        # refused instead of pushing one of them (the agent's) out.
        waiting[1].send(b"hello 8 10000\n")
        late.send(b"hello 9 10000\n")
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(box.channel.writers) == 3
        refused = await box.connect()
        assert closed(refused)
        assert not closed(agent)
        assert await box.server.send("s1", "inbound", 1)
        await asyncio.sleep(0.01)
        assert agent.recv(100) == b"inbound 1\n"

    asyncio.run(run(body))


def test_a_peer_that_stops_reading_cannot_hold_up_sends(
    in_unit: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control, "SEND_TIMEOUT", 0.05)

    async def body(box: Box) -> None:
        agent = await box.connect(b"hello 7 10000\n")
        stuck = await box.connect(b"hello 8 10000\n")
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        got = b""
        for seq in range(1, 20_000):
            assert await asyncio.wait_for(box.server.send("s1", "inbound", seq), 1)
            with contextlib.suppress(BlockingIOError):
                got += agent.recv(65536)
            if len(box.channel.writers) == 1:
                break
        assert len(box.channel.writers) == 1, "the stuck reader was never dropped"
        assert closed(stuck)
        assert not box.channel.disconnected.is_set()
        assert got.startswith(b"inbound 1\ninbound 2\n")

    asyncio.run(run(body))


def test_only_the_last_connection_leaving_means_the_sandbox_went_away(in_unit: None) -> None:
    async def body(box: Box) -> None:
        agent = await box.connect(b"hello 7 10000\n")
        extra = await box.connect(b"hello 8 10000\n")
        extra.close()
        for _ in range(20):
            await asyncio.sleep(0)
        assert not box.channel.disconnected.is_set()
        agent.close()
        await asyncio.wait_for(box.channel.disconnected.wait(), 5)

    asyncio.run(run(body))


def test_an_agent_that_comes_back_is_connected_and_a_new_wait_begins(in_unit: None) -> None:
    """The daemon drops an agent that stops reading; the agent connects again. The session's
    watch must see it back (``connected``) and wait for its new connection to end. The same
    case holds the fake to it in tests/contract/test_control.py, where the real server runs
    only under ``--real-host``; here it runs on every unit-tier run."""

    async def body(box: Box) -> None:
        agent = await box.connect(b"hello 7 10000\n")
        assert box.server.connected("s1")
        agent.close()
        await asyncio.wait_for(box.server.wait_disconnect("s1"), 5)
        assert not box.server.connected("s1")
        again = await box.connect(b"hello 7 10000\n")
        assert box.server.connected("s1")
        waiting = asyncio.ensure_future(box.server.wait_disconnect("s1"))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # a new wait, not the old one's end
        again.close()
        await asyncio.wait_for(waiting, 5)

    asyncio.run(run(body))
