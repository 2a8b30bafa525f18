"""A session's sockets are accepted on at its connection rate (ironclawd/api/accept.py, ``[sockets]
connections_per_second``, twice that saved up): past it the listener is not watched, and the
connects wait in the kernel's backlog. Each connection was accepted, given a task and its peer
checked before the rate refused it, and control.sock had no rate at all: a box connecting and
closing in a loop cost the event loop ~60% of its time (found by a review). A host user's
connection, refused at its check, spends none of the rate.

Over real Unix sockets in a temporary directory; the cgroup check is counted, not made."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from ironclawd.api import control
from ironclawd.api.accept import PacedServer
from ironclawd.api.control import ControlServer
from ironclawd.api.limits import TokenBucket
from ironclawd.api.sandbox_sockets import SandboxPeer, SessionSockets
from ironclawd.config import SocketsConfig

RATE = 20.0
BURST = 2 * RATE
LIMITS = SocketsConfig(connections_per_second=RATE)
SID, OTHER = "sess0001", "sess0002"


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The unit of every peer checked, each found in it; no owner changed."""
    units: list[str] = []

    def in_unit(sock: socket.socket, unit: str) -> bool:
        units.append(unit)
        return True

    monkeypatch.setattr(control, "peer_in_unit", in_unit)
    monkeypatch.setattr(os, "chown", lambda *args, **kwargs: None)
    return units


def churn(path: Path, count: int) -> None:
    """What a looping box does: connect and close at once, ``count`` times (all fit in the
    backlog of 128)."""
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.connect(str(path))
        sock.close()


async def turns(seconds: float) -> None:
    """Let the loop run for ``seconds``."""
    await asyncio.sleep(seconds)


def most(seconds: float) -> float:
    """The most connections a socket may take in ``seconds``: its saved-up ones, then the rate
    (and one for the clock's grain)."""
    return BURST + RATE * seconds + 1


def unit_of(sid: str) -> str:
    return f"ironclaw-sbx-{sid}.service"


def test_a_box_churning_its_model_socket_is_accepted_at_its_rate_and_others_at_once(
    tmp_path: Path, checked: list[str]
) -> None:
    async def go() -> None:
        peers: dict[str, SandboxPeer] = {}
        sockets = SessionSockets(tmp_path / "no-internal.sock", tmp_path, LIMITS, peers)
        for sid in (SID, OTHER):
            (tmp_path / sid).mkdir()
            await sockets.open(sid, "model")
        try:
            started = time.monotonic()
            churn(sockets.path(SID, "model"), 100)
            await turns(0.3)
            taken = checked.count(unit_of(SID))
            assert BURST <= taken <= most(time.monotonic() - started)  # was 100: all of them
            # Another session's socket is its own: taken at once while the first one waits.
            churn(sockets.path(OTHER, "model"), 1)
            await turns(0.05)
            assert checked.count(unit_of(OTHER)) == 1
        finally:
            await sockets.close_all()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_control_sock_has_a_connection_rate_and_the_agents_reconnect_still_gets_through(
    tmp_path: Path, checked: list[str]
) -> None:
    async def go() -> None:
        server = ControlServer(tmp_path, LIMITS)
        path = await server.open(SID) / control.CONTROL_SOCKET
        try:
            started = time.monotonic()
            churn(path, 50)
            await turns(0.1)
            assert checked.count(unit_of(SID)) <= most(time.monotonic() - started)  # was 50
            # The agent's reconnect (after a daemon crash) waits its turn behind the churn,
            # and its hello is taken once it is accepted.
            agent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            agent.setblocking(False)
            agent.connect(str(path))
            agent.send(b"hello 7 10000\n")
            async with asyncio.timeout(5):
                hello = await server.wait_hello(SID)
            assert (hello.pid, hello.uid) == (7, 10000)
            agent.close()
        finally:
            await server.close(SID)

    asyncio.run(asyncio.wait_for(go(), 30))


async def _paced(
    tmp_path: Path,
    admit: Callable[[socket.socket], bool],
    body: Callable[[PacedServer, Path, list[socket.socket]], Awaitable[None]],
) -> None:
    path = tmp_path / "paced.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(128)
    served: list[socket.socket] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(writer.get_extra_info("socket"))
        await reader.read()
        writer.close()

    server = PacedServer(listener, handler, TokenBucket(RATE, BURST), admit, sid=SID,
                         name="paced.sock", limit=256)  # fmt: skip
    try:
        await body(server, path, served)
    finally:
        server.close()


def test_connections_from_outside_the_unit_spend_none_of_the_rate(tmp_path: Path) -> None:
    outsiders = [True]

    async def body(server: PacedServer, path: Path, served: list[socket.socket]) -> None:
        churn(path, 100)  # a host user, refused at its check
        await turns(0.05)
        assert served == []
        assert not server.paced()
        outsiders[0] = False
        churn(path, 1)  # the agent: taken at once
        await turns(0.05)
        assert len(served) == 1

    asyncio.run(_paced(tmp_path, lambda sock: not outsiders[0], body))


def test_a_paced_listener_takes_its_backlog_at_the_rate_and_closes_while_resting(
    tmp_path: Path,
) -> None:
    async def body(server: PacedServer, path: Path, served: list[socket.socket]) -> None:
        started = time.monotonic()
        churn(path, 60)
        await turns(0.02)
        assert BURST <= len(served) <= most(time.monotonic() - started)
        assert server.paced()
        async with asyncio.timeout(5):
            while len(served) < 60:  # noqa: ASYNC110 (the rate's timer resumes the listener)
                await asyncio.sleep(0.01)
        assert time.monotonic() - started >= (60 - BURST) / RATE * 0.9
        churn(path, 60)
        await turns(0.01)
        assert server.paced()
        server.close()  # while resting: its timer must not watch a closed listener again
        assert server.sockets == ()
        await turns(0.2)
        assert not server.paced()

    asyncio.run(_paced(tmp_path, lambda sock: True, body))


def test_a_peer_check_that_raises_refuses_the_connection_and_the_listener_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A host user can make the peer check raise (a cgroup path that is not UTF-8 under its
    delegated subtree: /proc/<pid>/cgroup then does not decode): the exception left the
    listener's callback, asyncio logged a traceback for every connect, unthrottled, and the
    connection was never closed there (a review of this stop's diff)."""
    raising = [True]

    def admit(sock: socket.socket) -> bool:
        if raising[0]:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return True

    async def body(server: PacedServer, path: Path, served: list[socket.socket]) -> None:
        churn(path, 50)
        await turns(0.1)
        assert served == []
        raising[0] = False
        churn(path, 1)  # the listener still serves
        await turns(0.05)
        assert len(served) == 1

    with caplog.at_level("ERROR"):
        asyncio.run(_paced(tmp_path, admit, body))
    traces = [r for r in caplog.records if r.exc_info]
    assert traces == [], traces
    checks = [r for r in caplog.records if "checking a connection" in r.getMessage()]
    assert 1 <= len(checks) <= 11, len(checks)  # ratelog's window, not one a connect


def test_a_peer_whose_cgroup_file_does_not_decode_is_refused_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = Path.read_text

    def read_text(self: Path, *args: object, **kwargs: object) -> str:
        if str(self).endswith("/cgroup") and str(self) != "/proc/1/cgroup":
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", read_text)
    a, b = socket.socketpair()
    try:
        assert control.peer_in_unit(a, unit_of(SID)) is False
    finally:
        a.close()
        b.close()
