"""An agent of a protocol version this daemon does not speak (frozen into another ironclawd
version's package, adopted after an upgrade or a downgrade) is refused at its hello and at the
restore of its connection: a journal line names the session, the version found and those known,
nothing is said to it or read from it, and its session ends failed with the reason and the way
out, its sandbox stopped and its queues kept. Over real Unix sockets (tests/unit/
test_control_handover.py's stand-ins for root and the unit's cgroup)."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest

from ironclawd.api import control
from ironclawd.api.control import ControlServer
from ironclawd.domain import agent_protocol
from ironclawd.domain.session import State
from ironclawd.errors import HostError
from ironclawd.services.reconcile import reconcile
from tests.unit.test_control_handover import Events, agent_connect, no_root_needed
from tests.unit.test_session_service import SID, World, _left_running, _run

__all__ = ["no_root_needed"]  # the fixture, used here too

REFUSED = "its agent speaks protocol version 2, this ironclawd speaks version 1 "


async def _ended(sock: socket.socket) -> bytes:
    """What the daemon sent before it ended the connection."""
    loop, got = asyncio.get_running_loop(), b""
    async with asyncio.timeout(5):
        while chunk := await loop.sock_recv(sock, 100):
            got += chunk
    return got


def _journal(caplog: pytest.LogCaptureFixture, sid: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "ironclawd.control" and r.levelno == logging.WARNING
            and r.getMessage().startswith(f"session {sid}: refused")]  # fmt: skip


def test_an_agent_of_an_unknown_version_is_refused_at_its_hello(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sid = "refusehello01"

    async def body() -> None:
        server, events = ControlServer(tmp_path), Events()
        server.set_listener(events)
        path = await server.open(sid) / control.CONTROL_SOCKET
        agent = await agent_connect(path, b"hello 7 1000 3 v2\n")
        with pytest.raises(HostError, match=f"^{REFUSED}.*'ironctl session start {sid}'"):
            await asyncio.wait_for(server.wait_hello(sid), 5)
        assert await _ended(agent) == b""
        assert events.seen == []  # its "outbound 3" was not taken up
        assert not server.connected(sid)
        agent.close()
        await server.close_all_listeners()

    caplog.set_level(logging.WARNING, "ironclawd.control")
    asyncio.run(body())
    (line,) = _journal(caplog, sid)
    assert line.startswith(f"session {sid}: refused the control connection of agent pid 7: ")
    assert "protocol version 2, this ironclawd speaks version 1 " in line


def test_a_restored_connection_of_an_unknown_version_is_refused_unread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Restored, it says no hello: the version its name carries is checked instead, before the
    "restarted" line and before its outbound queue is read again ("resync")."""
    sid = "refusekept01"

    async def body() -> None:
        ours, agent = socket.socketpair()
        agent.setblocking(False)
        server, events = ControlServer(tmp_path), Events()
        server.set_listener(events)
        assert server.restore({f"control.{sid}.7.1000.v2.resync": [ours]}) == 1
        await server.open(sid)
        with pytest.raises(HostError, match=f"^{REFUSED}"):
            await asyncio.wait_for(server.wait_hello(sid), 5)
        assert await _ended(agent) == b""  # not even "restarted 0"
        assert events.seen == []
        assert [name for name, _ in await server.hand_over()] == [f"control.{sid}"]
        agent.close()
        await server.close_all_listeners()

    caplog.set_level(logging.WARNING, "ironclawd.control")
    asyncio.run(body())
    assert len(_journal(caplog, sid)) == 1


def _world_on_real_sockets(tmp_path: Path) -> tuple[World, ControlServer]:
    """A session left running, with its queues, whose control socket is the real server."""
    world = World()
    _left_running(world)
    world.data.prepare(SID, 1000, 1000)
    world.data.inbound(SID, 1000).append("a message before the upgrade", 1.0, None)
    world.log.clear()
    server = ControlServer(tmp_path)
    world.service.lifecycle.control = server
    return world, server


async def _says_hello(server: ControlServer, path: Path, line: bytes) -> socket.socket:
    """The agent reconnects (no fd store: the daemon crashed) once the socket is served."""
    async with asyncio.timeout(5):
        while SID not in server._channels:  # noqa: ASYNC110 (nothing announces an open)
            await asyncio.sleep(0.005)
    return await agent_connect(path, line)


@pytest.mark.parametrize("how", ["restored", "hello"])
def test_an_adopted_agent_of_an_unknown_version_fails_its_session_and_keeps_its_queues(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    world, server = _world_on_real_sockets(tmp_path)
    ours, agent = socket.socketpair()
    if how == "restored":
        server.restore({f"control.{SID}.7.1000.v2": [ours]})

    async def go() -> list[str]:
        if how == "hello":
            path = tmp_path / SID / control.CONTROL_SOCKET
            saying = asyncio.create_task(_says_hello(server, path, b"hello 7 1000 0 v2\n"))
        report = await reconcile(world.service)
        if how == "hello":
            (await saying).close()
        return report.settled

    caplog.set_level(logging.WARNING)
    assert _run(world, go()) == [SID]
    failed = world.store.get(SID)
    assert failed.state is State.FAILED
    assert failed.error.startswith(f"adopting session {SID}: {REFUSED}")
    assert f"start the session again ('ironctl session start {SID}')" in failed.error
    assert ("units.stop", failed.unit) in world.log  # its sandbox stopped
    assert "data.destroy" not in world.effects()  # its data kept
    assert [row[0] for row in world.data.inbound(SID, 1000).rows] == [
        "a message before the upgrade"
    ]
    assert _journal(caplog, SID), "no journal line named the refusal"
    ours.close()
    agent.close()


def test_an_adopted_agent_under_an_earlier_versions_name_runs_on(tmp_path: Path) -> None:
    """The control for the test above: the same set-up with a name as every earlier version
    wrote it (no version: version 1) adopts the session."""
    world, server = _world_on_real_sockets(tmp_path)
    ours, agent = socket.socketpair()
    server.restore({f"control.{SID}.7.1000": [ours]})

    async def go() -> list[str]:
        report = await reconcile(world.service)
        assert world.store.get(SID).state is State.RUNNING
        await world.service.close()  # as the daemon stops: the sandbox runs on
        await server.close_all_listeners()
        return report.adopted

    assert _run(world, go()) == [SID]
    assert ("units.stop", world.store.get(SID).unit) not in world.log
    agent.close()


def test_the_refusal_names_every_version_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_protocol, "KNOWN_PROTOCOLS", (1, 2))
    assert agent_protocol.refusal("s1", 2) is None
    why = agent_protocol.refusal("s1", 3) or ""
    assert why.startswith(
        "its agent speaks protocol version 3, this ironclawd speaks versions 1, 2 "
    )
