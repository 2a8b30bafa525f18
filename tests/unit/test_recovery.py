"""Reconcile after READY (issue 17): the sessions an earlier daemon left live are claimed before
the admin API serves, shown "recovering", and a command on one waits until it is settled;
sessions created meanwhile are never taken for orphans."""

from __future__ import annotations

import asyncio

from ironclaw.admin.v1 import admin_pb2
from ironclawd.api.admin import session_to_proto
from ironclawd.domain.session import Session, State
from ironclawd.services.reconcile import claim, reconcile
from tests.unit.test_session_service import SID, World, _left_running, _run, _spec

NEW = "n3wsessi0n01"


async def _turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_stop_during_recovery_waits_until_the_session_is_adopted() -> None:
    world = World()
    _left_running(world)
    world.control.hello_gate = gate = asyncio.Event()

    async def go() -> tuple[list[str], State]:
        recovery = await claim(world.service)
        assert recovery.pending == {SID}
        reconciling = asyncio.create_task(reconcile(world.service, recovery))
        stopping = asyncio.create_task(world.service.stop(SID))
        await _turns()
        assert not stopping.done()  # waits for the adoption, which waits for the agent
        assert world.store.get(SID).state is State.RUNNING
        assert recovery.pending == {SID}
        gate.set()
        report = await reconciling
        assert recovery.pending == set()
        stopped = await stopping
        return report.adopted, stopped.state

    assert _run(world, go()) == ([SID], State.STOPPED)
    events = world.audit.events()
    assert events.index("session.adopted") < events.index("session.stopping")


def test_a_session_created_during_recovery_is_not_an_orphan() -> None:
    world = World()
    _left_running(world)
    orphan = "ironclaw-sbx-zzzzzzzzzzzz.service"
    world.units.units[orphan] = world.units.start_transient(_spec(orphan), 1.0)
    world.control.hello_gate = gate = asyncio.Event()

    async def go() -> list[str]:
        recovery = await claim(world.service)
        reconciling = asyncio.create_task(reconcile(world.service, recovery))
        await _turns()
        gate.set()  # the new session's agent says hello too
        created = await world.service.create("demo", NEW)
        assert created.state is State.RUNNING
        report = await reconciling
        return report.removed

    removed = _run(world, go())
    assert removed == [f"unit {orphan}", f"failed state of {orphan}"]
    assert ("units.stop", f"ironclaw-sbx-{NEW}.service") not in world.log
    assert world.store.get(NEW).state is State.RUNNING
    assert world.store.get(SID).state is State.RUNNING


def test_a_claimed_session_is_listed_recovering_whatever_its_record_says() -> None:
    world = World()
    session = _left_running(world)
    assert session_to_proto(session).state == admin_pb2.SESSION_STATE_RUNNING
    assert session_to_proto(session, True).state == admin_pb2.SESSION_STATE_RECOVERING


def test_settled_sessions_are_claimed_by_nobody() -> None:
    world = World()
    _left_running(world)
    world.store.rows[NEW] = Session(NEW, "demo", State.STOPPED, 1.0, 1.0, 1.0)

    async def go() -> set[str]:
        recovery = await claim(world.service)
        pending = set(recovery.pending)
        await reconcile(world.service, recovery)
        assert not world.service.lock(SID).locked()
        return pending

    assert _run(world, go()) == {SID}
