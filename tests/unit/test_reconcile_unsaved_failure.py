"""The daemon's start settles what its last run left (reconcile) while the disk takes no record
(a full disk, EIO). A session it could not settle is torn down and recorded failed, its last
resort (``mark_failed``); that save failed too, so the record kept the state the last run had
left for the whole of this run: one left starting or creating answered every start with
Conflict, one left running (its agent never reconnected, its sandbox torn down) answered a
start with "running" and had no sandbox. The last resort's failure is held in memory now, as a
failed command's is (services/session_records.py), and the next save writes it."""

from __future__ import annotations

import asyncio

import pytest

from ironclawd.domain.session import Session, State
from ironclawd.services.reconcile import reconcile
from tests.unit.test_lifecycle_unsaved_failure import FullDisk, started_again
from tests.unit.test_session_service import SID, World, _left_running


@pytest.mark.parametrize("state", [State.CREATING, State.STARTING])
def test_a_session_left_mid_start_that_could_not_be_settled_starts_again(state: State) -> None:
    world = World()
    world.store.rows[SID] = Session(SID, "demo", state, 1.0, 1.0, 1.0)
    disk = FullDisk(world, lambda s: True)

    async def go() -> None:
        report = await reconcile(world.service)
        assert report.settled == [SID]
        assert world.store.rows[SID].state is state  # what the disk holds
        await started_again(world, disk)
        await world.service.close()

    asyncio.run(go())


def test_a_running_session_whose_agent_never_came_back_and_could_not_be_settled() -> None:
    world = World()
    _left_running(world)
    world.control.silent.add(SID)  # its agent never reconnects: it is torn down
    disk = FullDisk(world, lambda s: True)

    async def go() -> None:
        report = await reconcile(world.service)
        assert report.adopted == []
        assert world.store.rows[SID].state is State.RUNNING
        world.control.silent.discard(SID)
        await started_again(world, disk)
        await world.service.close()

    asyncio.run(go())
