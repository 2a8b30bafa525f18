"""A pooled sandbox waits for its claim on claim.sock (ironclawd/api/control.py ``open_claim``,
``wake``; agent/main.py ``wait_for_claim``), over real Unix sockets in a temporary directory:
the host says one line only when woken, closes anyone outside the unit without a word, and
leaves no socket behind; the agent returns once woken and the key is whole, and falls back to
polling the key file when the socket is missing or ends without the line. (The cgroup check
itself is the real tier's: tests/redteam/test_pool_isolation.py.)"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agent import main as agent_main
from ironclawd.api import control
from ironclawd.api.control import CLAIM_SOCKET, CLAIMED_LINE, ControlServer
from ironclawd.config import SocketsConfig

SID = "pooled0001"
KEY = b"ab" * 32


async def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, str(path))
    for _ in range(20):  # let the server take the connection
        await asyncio.sleep(0)
    return sock


async def read_all(sock: socket.socket) -> bytes:
    """Everything the host sends until it closes (bounded: a test must not hang)."""
    loop = asyncio.get_running_loop()
    data = b""
    async with asyncio.timeout(5):
        try:
            while chunk := await loop.sock_recv(sock, 64):
                data += chunk
        except ConnectionResetError:
            pass
    return data


def nothing_yet(sock: socket.socket) -> bool:
    try:
        sock.recv(64)
    except BlockingIOError:
        return True
    return False


@pytest.fixture(autouse=True)
def chowned(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """``bind_unix_socket`` gives the socket to root: recorded here, not done (the unit tier
    changes no owner)."""
    calls: list[tuple[str, int, int]] = []

    def chown(path: object, uid: int, gid: int, **_: object) -> None:
        calls.append((str(path), uid, gid))

    monkeypatch.setattr(os, "chown", chown)
    return calls


def served(
    tmp_path: Path, body: Callable[[ControlServer, Path], Awaitable[None]], limit: int = 3
) -> None:
    async def go() -> None:
        server = ControlServer(tmp_path, SocketsConfig(max_control_connections=limit))
        try:
            directory = await server.open_claim(SID)
            await body(server, directory / CLAIM_SOCKET)
        finally:
            await server.close(SID)

    asyncio.run(go())


def test_the_waiting_agent_hears_one_line_only_when_woken_and_the_socket_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chowned: list[tuple[str, int, int]]
) -> None:
    monkeypatch.setattr(
        control, "peer_in_unit", lambda sock, unit: unit.endswith(f"-{SID}.service")
    )

    async def body(server: ControlServer, path: Path) -> None:
        assert await asyncio.to_thread(path.is_socket)
        mode = (await asyncio.to_thread(path.stat)).st_mode
        assert mode & 0o777 == 0o666
        assert chowned == [(str(path), 0, -1)]  # root's, any group (no group's in particular)
        agent = await connect(path)
        await asyncio.sleep(0.05)
        assert nothing_yet(agent)  # nothing until a claim
        await server.open(SID)  # the claim serves the control socket first: the wait goes on
        await asyncio.sleep(0.05)
        assert nothing_yet(agent)
        await server.wake(SID)
        assert await read_all(agent) == CLAIMED_LINE
        assert not await asyncio.to_thread(path.exists)
        await server.wake(SID)  # a second wake (or one for a cold session) does nothing
        agent.close()

    served(tmp_path, body)


def test_claim_waiting_is_true_only_while_the_units_own_agent_holds_its_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    insiders: set[int] = set()  # the server's ends of connections "from the unit"
    monkeypatch.setattr(control, "peer_in_unit", lambda sock, unit: sock.fileno() in insiders)

    async def body(server: ControlServer, path: Path) -> None:
        assert not server.claim_waiting(SID)  # nobody connected yet
        outsider = await connect(path)
        assert await read_all(outsider) == b""
        assert not server.claim_waiting(SID)  # an outsider proves nothing
        monkeypatch.setattr(control, "peer_in_unit", lambda sock, unit: True)
        agent = await connect(path)
        assert server.claim_waiting(SID)
        agent.close()  # the agent died: its end closed
        async with asyncio.timeout(5):
            while server.claim_waiting(SID):  # noqa: ASYNC110 (the server's read sees the end)
                await asyncio.sleep(0.001)
        again = await connect(path)
        assert server.claim_waiting(SID)
        await server.wake(SID)
        assert not server.claim_waiting(SID)  # claimed: no longer waiting
        assert await read_all(again) == CLAIMED_LINE
        assert not server.claim_waiting("pooled0009")  # not a pooled sandbox
        outsider.close()
        again.close()

    served(tmp_path, body)


def test_claim_lost_is_told_once_when_the_last_agent_connection_ends_from_its_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control, "peer_in_unit", lambda sock, unit: True)
    lost: list[str] = []

    async def settle() -> None:
        for _ in range(50):
            await asyncio.sleep(0.001)

    async def go() -> None:
        server = ControlServer(tmp_path, SocketsConfig(max_control_connections=2))
        server.on_claim_lost(lost.append)
        path = await server.open_claim(SID) / CLAIM_SOCKET
        first, second = await connect(path), await connect(path)
        third = await connect(path)  # pushes the first out: the daemon's doing, not a loss
        assert await read_all(first) == b""
        second.close()  # one of two ends: the third still waits
        await settle()
        assert lost == []
        third.close()  # the last one: the agent is gone
        await settle()
        assert lost == [SID]
        # Neither a wake nor a teardown is a loss.
        for sid, end in (("pooled0002", "wake"), ("pooled0003", "close")):
            agent = await connect(await server.open_claim(sid) / CLAIM_SOCKET)
            await (server.wake(sid) if end == "wake" else server.close(sid))
            await read_all(agent)
            agent.close()
            await settle()
        assert lost == [SID]
        first.close()
        await server.close(SID)

    asyncio.run(go())


def test_a_connection_from_outside_the_unit_is_closed_without_a_word(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control, "peer_in_unit", lambda sock, unit: False)

    async def body(server: ControlServer, path: Path) -> None:
        outsider = await connect(path)
        assert await read_all(outsider) == b""
        await server.wake(SID)  # the claim still goes ahead
        assert not await asyncio.to_thread(path.exists)
        outsider.close()

    served(tmp_path, body)


def test_connections_are_bounded_and_the_oldest_goes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control, "peer_in_unit", lambda sock, unit: True)

    async def body(server: ControlServer, path: Path) -> None:
        first = await connect(path)
        second = await connect(path)
        third = await connect(path)
        assert await read_all(first) == b""  # pushed out by the third (limit 2)
        await server.wake(SID)
        assert await read_all(second) == CLAIMED_LINE
        assert await read_all(third) == CLAIMED_LINE
        for sock in (first, second, third):
            sock.close()

    served(tmp_path, body, limit=2)


def test_closing_a_pooled_sandbox_ends_the_wait_without_the_line_and_removes_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control, "peer_in_unit", lambda sock, unit: True)

    async def go() -> None:
        server = ControlServer(tmp_path)
        directory = await server.open_claim(SID)
        agent = await connect(directory / CLAIM_SOCKET)
        await server.close(SID)
        assert await read_all(agent) == b""
        assert not await asyncio.to_thread(directory.exists)
        agent.close()
        # Shutdown closes the listeners of pooled sandboxes too.
        await server.open_claim("pooled0002")
        await server.close_all_listeners()
        assert not await asyncio.to_thread((tmp_path / "pooled0002" / CLAIM_SOCKET).exists)

    asyncio.run(go())


def serve_once(path: Path, answer: bytes, key: Path | None) -> threading.Thread:
    """A host stand-in: accept one connection on ``path``; write ``key`` (if given), then
    ``answer``, then close."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def run() -> None:
        with listener, listener.accept()[0] as conn:
            if key is not None:
                key.write_bytes(KEY)
            if answer:
                conn.sendall(answer)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def claim_on_the_first_poll(key: Path, polls: list[float]) -> Callable[[float], None]:
    def sleep(seconds: float) -> None:
        polls.append(seconds)
        if seconds == agent_main.POOLED_POLL:
            key.write_bytes(KEY)

    return sleep


def test_the_agent_returns_once_woken_without_polling_the_key(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_bytes(b"")
    polls: list[float] = []
    thread = serve_once(tmp_path / CLAIM_SOCKET, CLAIMED_LINE, key)
    agent_main.wait_for_claim(
        str(tmp_path / "control.sock"), key, sleep=claim_on_the_first_poll(key, polls)
    )
    thread.join(5)
    assert key.read_bytes() == KEY
    assert polls == []  # woken: not a single poll, not a single retry


def test_the_agent_polls_the_key_when_the_wait_ends_without_the_line(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_bytes(b"")
    polls: list[float] = []
    thread = serve_once(tmp_path / CLAIM_SOCKET, b"", None)  # the host went away
    agent_main.wait_for_claim(
        str(tmp_path / "control.sock"), key, sleep=claim_on_the_first_poll(key, polls)
    )
    thread.join(5)
    assert key.read_bytes() == KEY
    assert polls == [agent_main.POOLED_POLL]


def test_the_agent_polls_the_key_when_there_is_no_claim_socket(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_bytes(b"")
    polls: list[float] = []
    agent_main.wait_for_claim(
        str(tmp_path / "control.sock"), key, deadline=0.2,
        sleep=claim_on_the_first_poll(key, polls),
    )  # fmt: skip
    assert key.read_bytes() == KEY
    assert polls[-1] == agent_main.POOLED_POLL  # connect retries, then the key's poll
    assert polls.count(agent_main.POOLED_POLL) == 1


class Stop(Exception):
    pass


@pytest.mark.parametrize("pooled", [True, False])
def test_a_pooled_agent_starts_grpc_before_it_waits_and_a_cold_one_does_not(
    monkeypatch: pytest.MonkeyPatch, pooled: bool
) -> None:
    steps: list[str] = []
    monkeypatch.setattr(agent_main, "warm_grpc", lambda: steps.append("warm"))
    monkeypatch.setattr(agent_main, "wait_for_claim", lambda *_: steps.append("wait"))

    def agent() -> None:
        steps.append("agent")
        raise Stop

    monkeypatch.setattr(agent_main, "Agent", agent)
    with pytest.raises(Stop):
        agent_main.run_control("/nonexistent/control.sock", pooled=pooled)
    assert steps == (["warm", "wait", "agent"] if pooled else ["agent"])


@pytest.mark.parametrize("pooled", [True, False])
def test_only_a_claimed_agents_first_connection_prepares_for_a_message(
    monkeypatch: pytest.MonkeyPatch, pooled: bool
) -> None:
    """The first connection after a claim: a message is on its way. A later one follows a
    daemon restart (no message expected), and a cold sandbox's first one is not a claim."""
    monkeypatch.setattr(agent_main, "warm_grpc", lambda: None)
    monkeypatch.setattr(agent_main, "wait_for_claim", lambda *_: None)
    ends: list[socket.socket] = []

    def connect(*_args: object, **_kwargs: object) -> socket.socket:
        ours, theirs = socket.socketpair()
        ends.append(theirs)
        return ours

    monkeypatch.setattr(agent_main, "connect_control", connect)
    served: list[bool] = []

    class Worker:
        def serve(self, sock: socket.socket, *, claimed: bool = False) -> None:
            sock.close()
            served.append(claimed)
            if len(served) == 2:
                raise Stop

    monkeypatch.setattr(agent_main, "Agent", Worker)
    try:
        with pytest.raises(Stop):
            agent_main.run_control("/nonexistent/control.sock", pooled=pooled)
    finally:
        for end in ends:
            end.close()
    assert served == ([True, False] if pooled else [False, False])
