"""A session an approved change's restart marked (``Session.restarting``) is started at the
next start of the daemon, whatever became of its change: the mark never outlives that start.

The restart's start could fail to record its end: the disk full when it wrote RUNNING, then
again when the failure was to be recorded. The sandbox was torn down and the record stayed
starting and marked; the change was recorded applied once space came back. The next start
settled the session stopped, still marked, and only the resume of an approved change started a
marked session: none was left, so it stayed down (and marked) until the agent's next change."""

from __future__ import annotations

import asyncio

import pytest

from ironclawd.domain.changes import ChangeState
from ironclawd.domain.session import Session, State
from ironclawd.errors import DiskFull
from ironclawd.services.reconcile import reconcile
from tests.fakes import MemoryAgents, MemoryChanges
from tests.unit.test_lifecycle_leftovers_restart import ALICE, Daemon, _world
from tests.unit.test_session_service import SID

OTHER = "otherses0001"


def test_a_restart_that_could_not_record_its_end_is_started_at_the_next_start() -> None:
    world = _world()
    changes, agents = MemoryChanges(), MemoryAgents()
    first = Daemon(world, changes, agents)
    save = world.store.save
    failing = 0  # saves still to fail (a full disk)

    def save_or_fail(session: Session) -> None:
        nonlocal failing
        if session.state is State.RUNNING and session.sid == SID:
            failing = max(failing, 2)  # this save, and the failure's record after it
        if failing:
            failing -= 1
            raise DiskFull(f"saving session {session.sid}: database or disk is full")
        save(session)

    async def go() -> None:
        await first.service.create("demo", SID)
        change = first.submit()
        world.store.save = save_or_fail  # type: ignore[method-assign]
        await first.gateway.approve(change.id, change.hash, ALICE)
        world.store.save = save  # type: ignore[method-assign]
        left = world.store.get(SID)
        assert (left.state, left.restarting) == (State.STARTING, True)
        assert changes.changes[change.id].state is ChangeState.APPLIED
        await first.service.close()

        again = Daemon(world, changes, agents)
        await again.start_again()
        session = world.store.get(SID)
        assert (session.state, session.restarting, session.error) == (State.RUNNING, False, "")
        assert again.registry["demo"].persona == "New."
        await again.service.close()

    asyncio.run(go())


@pytest.mark.parametrize("state", [State.STOPPING, State.STOPPED, State.STARTING])
def test_the_reconcile_at_start_starts_a_marked_session_and_no_other(state: State) -> None:
    """A record the restart left ``state`` and marked (its sandbox gone with the host's last
    run) is settled stopped and started; a session stopped without the mark stays stopped."""
    world = _world()
    marked = Session(SID, "demo", state, 1.0, 1.0, 1.0, restarting=True)
    world.store.rows[SID] = marked
    world.store.rows[OTHER] = Session(OTHER, "demo", State.STOPPED, 1.0, 1.0, 1.0)

    async def go() -> None:
        report = await reconcile(world.service)
        session = world.store.get(SID)
        assert (session.state, session.restarting, session.error) == (State.RUNNING, False, "")
        assert report.restarted == [SID]
        assert world.store.get(OTHER).state is State.STOPPED
        await world.service.close()

    asyncio.run(go())
