"""The protocol version an agent speaks (ironclawd/domain/agent_protocol.py): named last in its
hello and in the fd store's name of its connection, from version 2 on. A hello or a name without
one (every agent and daemon before versions) is version 1, and a version-1 agent's hello and name
are byte for byte what they were, so daemons on both sides of the change read them."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from agent import loop
from agent.queues import QUEUE_VERSION as AGENT_QUEUES
from ironclawd.api import control
from ironclawd.api.control import ControlServer, _Kept, _parse_hello, _parse_store_name
from ironclawd.domain import agent_protocol
from ironclawd.host import fdstore
from ironclawd.ports import AgentHello
from ironclawd.store.outbound import OUTBOUND_VERSION
from ironclawd.store.queues import QUEUE_VERSION
from tests.unit.test_control_handover import SID, agent_connect, no_root_needed, store_copy

__all__ = ["no_root_needed"]  # the fixture, used here too


@pytest.mark.parametrize(
    ("line", "seq"), [(b"hello 7 1000\n", 0), (b"hello 7 1000 5\n", 5)]
)  # fmt: skip
def test_a_hello_without_a_version_is_version_1(line: bytes, seq: int) -> None:
    assert _parse_hello(line) == AgentHello(pid=7, uid=1000, outbound_seq=seq, protocol=1)


@pytest.mark.parametrize(
    ("line", "seq", "version"),
    [(b"hello 7 1000 5 v2\n", 5, 2), (b"hello 7 1000 v3\n", 0, 3), (b"hello 7 1000 5 v1\n", 5, 1)],
)
def test_a_hello_names_its_version_last(line: bytes, seq: int, version: int) -> None:
    assert _parse_hello(line) == AgentHello(7, 1000, outbound_seq=seq, protocol=version)


@pytest.mark.parametrize(
    "line",
    [
        b"hello 7 1000 5 v\n",
        b"hello 7 1000 5 vx\n",
        b"hello 7 1000 5 v-1\n",
        b"hello 7 1000 5 v1_0\n",
        b"hello 7 1000 5 v" + b"1" * (agent_protocol.VERSION_DIGITS + 1) + b"\n",
        b"hello 7 1000 v2 5\n",  # the version comes last
        b"hello 7 1000 5 v2 v2\n",
        b"hello v2\n",
        b"v2\n",
    ],
)
def test_a_hello_whose_version_is_not_plain_bounded_and_last_is_refused(line: bytes) -> None:
    with pytest.raises(ValueError, match=r"expected 'hello <pid> <uid> \[<outbound seq>\] \[v<"):
        _parse_hello(line)


def test_the_agents_hello_of_version_1_is_the_one_every_daemon_reads() -> None:
    """An earlier daemon takes 3 or 4 words: a version-1 agent names no version, so it works
    with one (a downgrade), and an agent of a later version is refused by it at its hello."""
    assert loop.hello_line(7, 1000, 5, protocol=1) == b"hello 7 1000 5\n"
    assert loop.hello_line(7, 1000, 5, protocol=2) == b"hello 7 1000 5 v2\n"
    assert _parse_hello(loop.hello_line(7, 1000, 5, protocol=2)).protocol == 2


def test_the_daemon_speaks_the_version_of_its_own_agent() -> None:
    assert loop.PROTOCOL_VERSION == agent_protocol.PROTOCOL_VERSION
    assert agent_protocol.PROTOCOL_VERSION in agent_protocol.KNOWN_PROTOCOLS
    assert _parse_hello(loop.hello_line(7, 1000, 5)).protocol == loop.PROTOCOL_VERSION


def test_a_new_queue_format_is_a_new_protocol_version() -> None:
    """The queue format is part of the protocol: a new QUEUE_VERSION needs a new
    PROTOCOL_VERSION (add the pair here), or an adopted agent is refused only at its first
    queue read instead of at its hello."""
    pairs = {(1, 1)}
    assert (agent_protocol.PROTOCOL_VERSION, QUEUE_VERSION) in pairs
    assert QUEUE_VERSION == OUTBOUND_VERSION == AGENT_QUEUES


@pytest.mark.parametrize(
    ("version", "resync", "name"),
    [
        (1, False, f"control.{SID}.7.1000"),  # as every earlier version named it
        (1, True, f"control.{SID}.7.1000.resync"),
        (2, False, f"control.{SID}.7.1000.v2"),
        (2, True, f"control.{SID}.7.1000.v2.resync"),
    ],
)
def test_a_connection_is_handed_over_under_a_name_with_its_version(
    version: int, resync: bool, name: str
) -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        hello = AgentHello(7, 1000, protocol=version)
        assert _Kept(ours, hello, resync).name(SID) == name
        assert _parse_store_name(name) == (SID, hello, resync)


@pytest.mark.parametrize("resync", [False, True])
def test_an_earlier_versions_name_without_a_version_is_adopted_as_version_1(resync: bool) -> None:
    name = f"control.{SID}.7.1000" + (".resync" if resync else "")
    assert _parse_store_name(name) == (SID, AgentHello(7, 1000, protocol=1), resync)
    assert _parse_store_name(f"control.{SID}.7.1000.v1") == (SID, AgentHello(7, 1000), False)


@pytest.mark.parametrize(
    "tail",
    [".v", ".vx", ".v-2", ".v2.v2", ".resync.v2", ".v2.resync.resync", ".x.resync",
     ".v" + "9" * (agent_protocol.VERSION_DIGITS + 1)],
)  # fmt: skip
def test_a_name_whose_version_is_not_plain_bounded_and_in_place_is_not_ours(tail: str) -> None:
    assert _parse_store_name(f"control.{SID}.7.1000{tail}") is None


def test_the_longest_name_a_box_can_cause_is_one_the_fd_store_takes() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        big = 10**control.ID_DIGITS - 1
        hello = AgentHello(big, big, protocol=10**agent_protocol.VERSION_DIGITS - 1)
        fdstore.check_name(_Kept(ours, hello, True).name("z" * 32))


def test_a_restored_connection_keeps_the_version_its_hello_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hello is not said again after a restart: the name carries the version over."""
    monkeypatch.setattr(agent_protocol, "KNOWN_PROTOCOLS", (1, 2))

    async def body() -> None:
        old = ControlServer(tmp_path)
        path = await old.open(SID) / control.CONTROL_SOCKET
        agent = await agent_connect(path, b"hello 7 1000 0 v2\n")
        assert (await asyncio.wait_for(old.wait_hello(SID), 5)).protocol == 2
        handed = await old.hand_over()
        assert f"control.{SID}.7.1000.v2" in [name for name, _ in handed]
        taken = store_copy(handed)
        await old.close_all_listeners()

        new = ControlServer(tmp_path)
        assert new.restore(taken) == 1
        await new.open(SID)
        assert await asyncio.wait_for(new.wait_hello(SID), 5) == AgentHello(7, 1000, protocol=2)
        agent.close()
        await new.close_all_listeners()

    asyncio.run(body())
