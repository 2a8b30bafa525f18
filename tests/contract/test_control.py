"""The control-socket port (``ControlPlane``): the fake (tests/fakes/host.py ``FakeControl``)
and the real ``ControlServer`` (api/control.py) behave alike towards the lifecycle and the pool.

The real one runs only under ``--real-host``, inside the private systemd (tests/integration/
test_contracts_real.py): it lets in only processes of the session's own unit, so each session's
agent side is a small helper process started in a transient unit of the session's name
(``ironclaw-sbx-<sid>.service`` in ironclaw.slice). The helper connects to the socket the test
names and hands the connected descriptor back over SCM_RIGHTS: the connection's peer is the
helper, inside the unit, and the test speaks and listens as the agent would. Closing that
descriptor is the agent's side ending its connection, as when a sandbox dies."""

from __future__ import annotations

import asyncio
import secrets
import shutil
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Protocol

import pytest

from ironclawd.api.control import CLAIM_SOCKET, CLAIMED_LINE, CONTROL_SOCKET, ControlServer
from ironclawd.domain.session import new_sid, unit_name
from ironclawd.errors import HostError
from ironclawd.host.systemd import SystemdUnitManager
from ironclawd.ports import ControlPlane, UnitSpec
from tests.fakes import FakeControl

pytestmark = pytest.mark.anyio
WAIT = 10.0  # seconds: any wait below is bounded, a broken adapter fails instead of hanging

# The helper: Debian's own python3, no site, nothing of the project. One line in on the driver
# socket (a socket path), one byte back with the descriptor connected to it ("!" and none if
# the connect failed). It lives until the driver socket ends.
HELPER = """\
import socket, sys
driver = socket.socket(socket.AF_UNIX)
driver.connect(sys.argv[1])
for line in driver.makefile("rb"):
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.connect(line.decode().strip())
    except OSError:
        driver.sendall(b"!")
        continue
    socket.send_fds(driver, [b"."], [sock.fileno()])
    sock.close()
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Agent(Protocol):
    """One connection of a session's agent, from the agent's side."""

    async def say(self, line: bytes) -> None: ...
    async def read_line(self) -> bytes: ...
    async def read_to_end(self) -> bytes:
        """What the host sends until it ends the connection."""
        ...

    async def leave(self) -> None:
        """End the connection from the agent's side (a sandbox that dies does)."""
        ...


class AgentSide(Protocol):
    async def connect(self, sid: str, socket_name: str) -> Agent:
        """A process of ``sid``'s own sandbox connects to ``socket_name`` in its directory."""
        ...

    def never_connects(self, sid: str) -> None:
        """``sid``'s agent will not connect (the real one connects only when told to)."""
        ...

    def connects_late(self, sid: str) -> None:
        """``sid``'s agent says hello only once ``connect``ed and told to (a back-off)."""
        ...

    async def close(self) -> None: ...


class FakeAgent:
    """The fake's agent: what the fake's knobs say a connection did."""

    def __init__(self, control: FakeControl, sid: str, socket_name: str) -> None:
        self._control, self._sid, self._claim = control, sid, socket_name == CLAIM_SOCKET

    async def say(self, line: bytes) -> None:
        assert line.startswith(b"hello 7 10000"), "the fake's agent says 'hello 7 10000'"
        if not self._claim:  # a hello: the fake's agent is connected (again), the gate open
            self._control.reconnect(self._sid)
            if self._control.hello_gate is not None:
                self._control.hello_gate.set()

    async def read_line(self) -> bytes:
        lines = self._control.delivered.get(self._sid, [])
        assert lines, f"nothing reached {self._sid}'s agent"
        return lines.pop(0)

    async def read_to_end(self) -> bytes:
        if self._claim:
            return CLAIMED_LINE if self._sid in self._control.woken else b""
        return b"".join(self._control.delivered.pop(self._sid, []))

    async def leave(self) -> None:
        if self._claim:
            self._control.lose_claim(self._sid)
        else:
            self._control.drop(self._sid)


class FakeAgents:
    def __init__(self, control: FakeControl) -> None:
        self._control = control

    async def connect(self, sid: str, socket_name: str) -> Agent:
        if socket_name == CLAIM_SOCKET:
            assert sid in self._control.made_dirs, f"{sid}: no claim socket to connect to"
            self._control.claim_waiters.add(sid)
        return FakeAgent(self._control, sid, socket_name)

    def never_connects(self, sid: str) -> None:
        self._control.silent.add(sid)  # the fake's agent says hello at once unless silent

    def connects_late(self, sid: str) -> None:
        self._control.hello_gate = asyncio.Event()  # opened by the agent's hello (``say``)

    async def close(self) -> None:
        pass


class SocketAgent:
    """A real connection whose peer is the helper in the session's unit."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._buffer = b""

    async def say(self, line: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self._sock, line)

    async def _more(self) -> bytes:
        async with asyncio.timeout(WAIT):
            try:
                return await asyncio.get_running_loop().sock_recv(self._sock, 4096)
            except ConnectionResetError:
                return b""

    async def read_line(self) -> bytes:
        while b"\n" not in self._buffer:
            chunk = await self._more()
            if not chunk:
                raise AssertionError(f"the host ended the connection; read {self._buffer!r}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line + b"\n"

    async def read_to_end(self) -> bytes:
        while chunk := await self._more():
            self._buffer += chunk
        data, self._buffer = self._buffer, b""
        return data

    async def leave(self) -> None:
        self._sock.close()


class UnitAgents:
    """One helper per session, in a transient unit of the session's own name."""

    def __init__(self, root: Path, sessions_dir: Path) -> None:
        self._root = root
        self._sessions_dir = sessions_dir
        self._units = SystemdUnitManager()
        self._helpers: dict[str, socket.socket] = {}
        self._agents: list[SocketAgent] = []

    async def connect(self, sid: str, socket_name: str) -> Agent:
        helper = self._helpers.get(sid) or await self._start(sid)
        path = self._sessions_dir / sid / socket_name

        def ask() -> socket.socket:
            helper.sendall(f"{path}\n".encode())
            _, fds, _, _ = socket.recv_fds(helper, 1, 1)
            if not fds:
                raise AssertionError(f"the helper in {unit_name(sid)} could not connect to {path}")
            return socket.socket(fileno=fds[0])

        agent = SocketAgent(await asyncio.to_thread(ask))
        self._agents.append(agent)
        return agent

    def never_connects(self, sid: str) -> None:
        pass

    def connects_late(self, sid: str) -> None:
        pass

    async def _start(self, sid: str) -> socket.socket:
        driver_path = self._root / f"driver-{sid}.sock"
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(driver_path))
        listener.listen(1)
        listener.settimeout(WAIT * 3)
        spec = UnitSpec(name=unit_name(sid), argv=["/usr/bin/python3", "-I", "-c", HELPER,
                        str(driver_path)], description="ironclaw control contract agent",
                        netns_path=None)  # fmt: skip
        try:
            await asyncio.to_thread(self._units.start_transient, spec, WAIT * 3)
            conn, _ = await asyncio.to_thread(listener.accept)
        finally:
            listener.close()
        conn.settimeout(WAIT)
        self._helpers[sid] = conn
        return conn

    async def close(self) -> None:
        for agent in self._agents:
            await agent.leave()
        for sid, conn in self._helpers.items():
            conn.close()
            await asyncio.to_thread(self._units.stop, unit_name(sid), WAIT * 3)


@pytest.fixture
async def world(host_impl: str) -> AsyncIterator[tuple[ControlPlane, AgentSide]]:
    control: ControlPlane
    agents: AgentSide
    root: Path | None = None
    if host_impl == "fake":
        fake = FakeControl()
        control, agents = fake, FakeAgents(fake)
    else:
        # Below /run: the helper's unit has a private /tmp, and the sessions directory of the
        # daemon is /run/ironclaw/sessions.
        root = Path("/run") / f"ironclaw-contract-{secrets.token_hex(4)}"
        root.mkdir(mode=0o711)
        control = ControlServer(root / "sessions")
        agents = UnitAgents(root, root / "sessions")
    try:
        yield control, agents
    finally:
        await agents.close()
        for sid in control.list_dirs():
            await control.close(sid)
        if root is not None:
            shutil.rmtree(root)


async def until(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` (bounded): the port announces neither a waiting agent nor its leaving
    other than through the hook, and the real one sees them only as its loop runs."""
    try:
        async with asyncio.timeout(WAIT):
            while not check():  # noqa: ASYNC110 (nothing to wait on: see above)
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"not within {WAIT} s: {what}") from None


async def test_an_opened_session_serves_its_agent_until_the_agent_leaves(
    world: tuple[ControlPlane, AgentSide],
) -> None:
    control, agents = world
    sid = new_sid()
    directory = await control.open(sid)
    assert directory.name == sid
    assert sid in control.list_dirs()
    agent = await agents.connect(sid, CONTROL_SOCKET)
    await agent.say(b"hello 7 10000\n")
    hello = await asyncio.wait_for(control.wait_hello(sid), WAIT)
    assert (hello.pid, hello.uid) == (7, 10000)
    assert await control.send(sid, "inbound", 5) is True
    assert await agent.read_line() == b"inbound 5\n"
    await agent.leave()
    await asyncio.wait_for(control.wait_disconnect(sid), WAIT)
    assert await control.send(sid, "inbound", 6) is False
    await control.close(sid)
    assert sid not in control.list_dirs()
    await control.close(sid)  # again: nothing to do


async def test_a_session_not_open_has_no_agent_to_wait_for_or_tell(
    world: tuple[ControlPlane, AgentSide],
) -> None:
    control, _ = world
    sid = new_sid()
    assert await control.send(sid, "inbound", 1) is False
    with pytest.raises(HostError, match=sid):
        await asyncio.wait_for(control.wait_hello(sid), WAIT)
    with pytest.raises(HostError, match=sid):
        await asyncio.wait_for(control.wait_disconnect(sid), WAIT)
    await control.open(sid)
    await control.close(sid)
    assert await control.send(sid, "inbound", 1) is False
    with pytest.raises(HostError, match=sid):
        await asyncio.wait_for(control.wait_hello(sid), WAIT)


async def test_closing_a_session_ends_the_waits_on_it(
    world: tuple[ControlPlane, AgentSide],
) -> None:
    """A create waiting for a hello fails with an error naming the session, not a
    CancelledError; the watcher waiting for the agent to leave returns."""
    control, agents = world
    silent, chatty = new_sid(), new_sid()
    agents.never_connects(silent)
    for sid in (silent, chatty):
        await control.open(sid)
    agent = await agents.connect(chatty, CONTROL_SOCKET)
    await agent.say(b"hello 7 10000\n")
    await asyncio.wait_for(control.wait_hello(chatty), WAIT)
    hello = asyncio.ensure_future(control.wait_hello(silent))  # its agent never connects
    gone = asyncio.ensure_future(control.wait_disconnect(chatty))
    await asyncio.sleep(0.05)
    assert not hello.done()
    assert not gone.done()
    await control.close(silent)
    await control.close(chatty)
    with pytest.raises(HostError, match=f"session {silent}: control socket closed"):
        await asyncio.wait_for(hello, WAIT)
    await asyncio.wait_for(gone, WAIT)
    assert await agent.read_to_end() == b""


async def test_a_wait_for_the_hello_lasts_until_a_late_agent_says_it(
    world: tuple[ControlPlane, AgentSide],
) -> None:
    """An agent slow to say hello (booting, or backing off before it reconnects) is neither
    connected nor sent to meanwhile; the wait for its hello ends when it says it."""
    control, agents = world
    sid = new_sid()
    agents.connects_late(sid)
    await control.open(sid)
    hello = asyncio.ensure_future(control.wait_hello(sid))
    await asyncio.sleep(0.05)
    assert not hello.done()
    assert not control.connected(sid)
    assert await control.send(sid, "inbound", 1) is False
    agent = await agents.connect(sid, CONTROL_SOCKET)
    await agent.say(b"hello 7 10000\n")
    said = await asyncio.wait_for(hello, WAIT)
    assert (said.pid, said.uid) == (7, 10000)
    await until(lambda: control.connected(sid), "the agent that said hello is connected")
    assert await control.send(sid, "inbound", 2) is True
    assert await agent.read_line() == b"inbound 2\n"


async def test_an_agent_that_comes_back_is_connected_and_a_new_wait_begins(
    world: tuple[ControlPlane, AgentSide],
) -> None:
    """The daemon drops an agent that stops reading; the agent connects again. The session's
    watch must see it back (``connected``), reach it, and wait for its new connection to end,
    not return at once on the end of the old one."""
    control, agents = world
    sid = new_sid()
    await control.open(sid)
    agent = await agents.connect(sid, CONTROL_SOCKET)
    await agent.say(b"hello 7 10000\n")
    await asyncio.wait_for(control.wait_hello(sid), WAIT)
    assert control.connected(sid)
    await agent.leave()
    await asyncio.wait_for(control.wait_disconnect(sid), WAIT)
    assert not control.connected(sid)
    assert await control.send(sid, "inbound", 1) is False
    again = await agents.connect(sid, CONTROL_SOCKET)
    await again.say(b"hello 7 10000\n")
    await until(lambda: control.connected(sid), "the agent back is connected")
    assert await control.send(sid, "inbound", 2) is True
    assert await again.read_line() == b"inbound 2\n"
    waiting = asyncio.ensure_future(control.wait_disconnect(sid))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # a new wait, not the old one's end
    await again.leave()
    await asyncio.wait_for(waiting, WAIT)
    assert not control.connected(sid)


def lost_claims(control: ControlPlane) -> list[str]:
    """The sessions the claim-lost hook hears of, in order."""
    lost: list[str] = []
    control.on_claim_lost(lost.append)
    return lost


async def pooled_and_waiting(control: ControlPlane, agents: AgentSide) -> tuple[str, Agent]:
    """A new pooled sandbox whose agent waits on its claim socket."""
    sid = new_sid()
    await control.open_claim(sid)
    waiting = await agents.connect(sid, CLAIM_SOCKET)
    await until(lambda: control.claim_waiting(sid), f"{sid}'s waiting agent is seen")
    return sid, waiting


async def test_a_pooled_sandbox_waits_on_its_claim_socket_until_woken(
    world: tuple[ControlPlane, AgentSide],
) -> None:
    control, agents = world
    sid = new_sid()
    lost = lost_claims(control)
    directory = await control.open_claim(sid)
    assert directory.name == sid
    assert sid in control.list_dirs()
    assert not control.claim_waiting(sid)
    waiting = await agents.connect(sid, CLAIM_SOCKET)
    await until(lambda: control.claim_waiting(sid), "the waiting agent is seen")
    await control.open(sid)  # a claim opens the session's socket before it wakes the agent
    assert control.claim_waiting(sid)
    await control.wake(sid)
    assert await waiting.read_to_end() == CLAIMED_LINE
    assert not control.claim_waiting(sid)
    await control.wake(sid)  # again: nothing to do
    agent = await agents.connect(sid, CONTROL_SOCKET)
    await agent.say(b"hello 7 10000\n")
    await asyncio.wait_for(control.wait_hello(sid), WAIT)
    await waiting.leave()  # after its claim: not a loss
    await asyncio.sleep(0.05)
    assert lost == []


async def test_a_pooled_sandbox_is_ready_once_its_agent_waits_on_the_claim_socket(
    world: tuple[ControlPlane, AgentSide],
) -> None:
    control, agents = world
    sid, silent = new_sid(), new_sid()
    with pytest.raises(HostError, match=f"session {sid}: claim socket not served"):
        await control.wait_claim(sid)
    await control.open_claim(sid)
    await agents.connect(sid, CLAIM_SOCKET)
    await asyncio.wait_for(control.wait_claim(sid), WAIT)
    assert control.claim_waiting(sid)
    await control.open(sid)
    await control.wake(sid)  # claimed: its claim socket is no longer served
    with pytest.raises(HostError, match="claim socket not served"):
        await control.wait_claim(sid)

    agents.never_connects(silent)
    await control.open_claim(silent)
    waiting = asyncio.ensure_future(control.wait_claim(silent))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # no agent yet
    await control.close(silent)  # a teardown ends the wait
    with pytest.raises(HostError, match=f"session {silent}: claim socket"):
        await asyncio.wait_for(waiting, WAIT)
    await control.close(sid)


async def test_a_pooled_agent_that_leaves_before_its_claim_is_reported_lost_once(
    world: tuple[ControlPlane, AgentSide],
) -> None:
    control, agents = world
    lost = lost_claims(control)
    sid, waiting = await pooled_and_waiting(control, agents)
    other, still = await pooled_and_waiting(control, agents)
    await waiting.leave()
    await until(lambda: lost == [sid], f"the hook hears of {sid}")
    assert not control.claim_waiting(sid)
    assert control.claim_waiting(other)
    await asyncio.sleep(0.05)
    assert lost == [sid]
    await control.close(other)  # a teardown, not a loss
    assert await still.read_to_end() == b""
    assert lost == [sid]


async def test_tearing_down_a_pooled_sandbox_is_not_a_lost_claim(
    world: tuple[ControlPlane, AgentSide],
) -> None:
    control, agents = world
    lost = lost_claims(control)
    sid, waiting = await pooled_and_waiting(control, agents)
    await control.close(sid)
    assert not control.claim_waiting(sid)
    assert await waiting.read_to_end() == b""  # cut without a word
    assert sid not in control.list_dirs()
    await asyncio.sleep(0.05)
    assert lost == []
    await control.wake(sid)  # a closed session: nothing to do


async def test_waking_a_session_that_was_never_pooled_changes_nothing(
    world: tuple[ControlPlane, AgentSide],
) -> None:
    control, agents = world
    sid = new_sid()
    await control.open(sid)
    assert not control.claim_waiting(sid)
    agent = await agents.connect(sid, CONTROL_SOCKET)
    await agent.say(b"hello 7 10000\n")
    await asyncio.wait_for(control.wait_hello(sid), WAIT)
    await control.wake(sid)
    assert await control.send(sid, "inbound", 2) is True
    assert await agent.read_line() == b"inbound 2\n"
