"""An approved change restarts its agent's running sessions: each is stopped, then started on
the new spec. A daemon stopping in between (the start refused, or cancelled after the stop
timeout) or killed there left the session stopped (or failed) and the change approved; the
next start's resume restarted only the sessions that ran, so that one stayed down although it
ran before the change: a conversation silently ended. Each record the restart writes for it
until it runs again is marked now, and the resume starts a marked session again."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from ironclawd.api.admin import session_to_proto
from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.changes import Change, ChangeState
from ironclawd.domain.session import Session, State
from ironclawd.host.mounts import HostMounts
from ironclawd.services.gateway import Gateway, GatewayPolicy
from ironclawd.services.reconcile import reconcile
from ironclawd.services.registry import Registry
from ironclawd.services.sessions import SessionService
from tests.fakes import FakeClock, MemoryAgents, MemoryChanges, RecordingAudit
from tests.unit.test_session_service import SID, World

DEMO = AgentSpec("demo")
ROOT = "uid:0(root)"
ALICE = "uid:1000(alice)"


class Daemon:
    """One run of the daemon: a new session service and gateway over ``world`` (its host and
    its state DB), and the gateway's changes and agents."""

    def __init__(self, world: World, changes: MemoryChanges, agents: MemoryAgents) -> None:
        self.world, self.changes = world, changes
        self.registry = Registry(agents, [DEMO], FakeClock(1000.0))
        self.service = SessionService(
            store=world.store, lifecycle=world.service.lifecycle, agents=self.registry,
            hooks=world.hooks, audit=world.audit, clock=world.clock,
        )  # fmt: skip
        self.gateway = Gateway(
            store=changes, registry=self.registry, audit=RecordingAudit(),
            policy=GatewayPolicy(), restart_agent_sessions=self.service.restart_agent_sessions,
            mounts=HostMounts(), clock=FakeClock(1000.0),
        )  # fmt: skip

    def submit(self) -> Change:
        return self.gateway.submit("persona", "demo", '{"persona": "New."}', "", ROOT)

    async def start_again(self) -> None:
        """What the next start does: reconcile, then resume the changes approved before."""
        await reconcile(self.service)
        await self.gateway.resume()


def _world(stop_timeout: float = 15.0) -> World:
    world = World(agent=DEMO, start_timeout=5.0)
    lifecycle = world.service.lifecycle
    lifecycle.layout = dataclasses.replace(lifecycle.layout, stop_timeout=stop_timeout)
    return world


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(400):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("never happened")


async def _brought_back(daemon: Daemon, change: Change) -> None:
    await daemon.start_again()
    session = daemon.world.store.get(SID)
    assert session.state is State.RUNNING, session
    assert (session.error, session.restarting) == ("", False)
    assert daemon.changes.changes[change.id].state is ChangeState.APPLIED
    assert daemon.registry["demo"].persona == "New."
    await daemon.service.close()


def test_a_session_stopped_by_the_restart_as_the_daemon_stops_is_started_at_the_resume() -> None:
    world = _world()
    changes, agents = MemoryChanges(), MemoryAgents()
    first = Daemon(world, changes, agents)
    armed = False

    async def open_(sid: str) -> None:
        pass

    async def close(sid: str) -> None:
        if armed:  # the restart tears the old sandbox down: the daemon is asked to stop
            asyncio.get_running_loop().create_task(first.service.close())

    world.hooks.on_sockets(open_, close)

    async def go() -> None:
        nonlocal armed
        await first.service.create("demo", SID)
        change = first.submit()
        armed = True
        approving = asyncio.ensure_future(first.gateway.approve(change.id, change.hash, ALICE))
        await asyncio.wait({approving}, timeout=5)
        assert approving.done()
        armed = False
        await first.service.close()
        await _brought_back(Daemon(world, changes, agents), change)

    asyncio.run(go())


def test_a_restart_whose_start_the_daemons_stop_cancels_is_finished_at_the_resume() -> None:
    world = _world(stop_timeout=0.1)
    changes, agents = MemoryChanges(), MemoryAgents()
    first = Daemon(world, changes, agents)

    async def go() -> None:
        await first.service.create("demo", SID)
        change = first.submit()
        world.control.hello_gate = asyncio.Event()  # the restart's start waits for its hello
        approving = asyncio.ensure_future(first.gateway.approve(change.id, change.hash, ALICE))
        await _until(lambda: world.store.get(SID).state is State.STARTING)
        await first.service.close()  # the start is cancelled after the stop timeout
        with pytest.raises(asyncio.CancelledError):
            await approving
        assert changes.changes[change.id].state is ChangeState.APPROVED
        assert world.store.get(SID).state is not State.RUNNING
        world.control.hello_gate = None
        await _brought_back(Daemon(world, changes, agents), change)

    asyncio.run(go())


def test_a_session_a_cut_restart_left_is_marked_and_shows_no_error() -> None:
    """What ``ironctl session list`` shows of a session whose restart the daemon's stop cut:
    stopped, no error (the mark was a text in its ERROR column), and marked for the next start."""
    world = _world(stop_timeout=0.1)
    changes, agents = MemoryChanges(), MemoryAgents()
    first = Daemon(world, changes, agents)

    async def go() -> None:
        await first.service.create("demo", SID)
        change = first.submit()
        world.control.hello_gate = asyncio.Event()
        approving = asyncio.ensure_future(first.gateway.approve(change.id, change.hash, ALICE))
        await _until(lambda: world.store.get(SID).state is State.STARTING)
        assert world.store.get(SID).restarting
        await first.service.close()
        with pytest.raises(asyncio.CancelledError):
            await approving
        left = world.store.get(SID)
        assert (left.state, left.restarting, left.error) == (State.STOPPED, True, "")
        assert session_to_proto(left).error == ""

    asyncio.run(go())


@pytest.mark.parametrize("state", [State.STOPPING, State.STOPPED, State.STARTING])
def test_a_restart_the_daemons_death_cuts_is_finished_at_the_next_start(state: State) -> None:
    """The daemon is killed just after the restart recorded the session ``state``: the next
    start finds that record (and no sandbox: a fresh host) and the change approved."""
    world = _world()
    changes, agents = MemoryChanges(), MemoryAgents()
    first = Daemon(world, changes, agents)
    left: dict[str, Any] = {}
    save = world.store.save
    restarting = False

    def save_and_snapshot(session: Session) -> None:
        save(session)
        if restarting and session.sid == SID and session.state is state and "rows" not in left:
            left["rows"] = dict(world.store.rows)
            left["changes"] = dict(changes.changes)
            left["agents"] = dict(agents.specs)

    world.store.save = save_and_snapshot  # type: ignore[method-assign]

    async def go() -> None:
        nonlocal restarting
        await first.service.create("demo", SID)
        change = first.submit()
        restarting = True
        await first.gateway.approve(change.id, change.hash, ALICE)
        await first.service.close()
        assert left, f"the restart never recorded the session {state.value}"
        marked = left["rows"][SID]
        assert (marked.restarting, marked.error) == (True, "")  # a mark, not an error
        assert left["changes"][change.id].state is ChangeState.APPROVED
        again = _world()
        again.store.rows.update(left["rows"])
        changes_left, agents_left = MemoryChanges(), MemoryAgents()
        changes_left.changes.update(left["changes"])
        agents_left.specs.update(left["agents"])
        await _brought_back(Daemon(again, changes_left, agents_left), change)

    asyncio.run(go())


def test_a_marked_session_the_operator_stops_is_not_started_by_the_resume() -> None:
    """A cut restart left the session stopped and marked; the operator stops it (on purpose:
    ``ironctl session stop`` answered "stopped"): the change's resume, or the restart of any
    later change of the agent, must not start it behind her back."""
    world = _world()

    async def go() -> None:
        service = world.service
        await service.create("demo", SID)
        await service.stop(SID)
        world.store.save(dataclasses.replace(world.store.get(SID), restarting=True))
        stopped = await service.stop(SID)
        assert stopped.state is State.STOPPED
        assert not stopped.restarting
        assert not world.store.get(SID).restarting
        assert await service.restart_agent_sessions("demo") == []
        assert world.store.get(SID).state is State.STOPPED
        await service.close()

    asyncio.run(go())
