"""A session record left in CREATING while the daemon runs (a create whose failure could not be
recorded: a full disk). ``stop`` and ``rm --force`` tried CREATING -> STOPPING, which the state
machine does not allow: the first call failed with Conflict (recording the session failed on its
way out), and only a second one worked. The first one works now."""

from __future__ import annotations

import asyncio

import pytest

from ironclawd.domain.session import Session, State
from ironclawd.errors import NotFound
from tests.unit.test_session_service import SID, World


def _left_creating(world: World) -> Session:
    session = Session(SID, "demo", State.CREATING, 1.0, 1.0, 1.0)
    world.store.rows[SID] = session
    return session


def test_a_session_left_creating_is_stopped_by_the_first_stop() -> None:
    world = World()
    session = _left_creating(world)

    async def go() -> None:
        stopped = await world.service.stop(SID)
        assert stopped.state is State.STOPPED
        await world.service.close()

    asyncio.run(go())
    assert world.store.get(SID).state is State.STOPPED
    assert ("units.stop", session.unit) in world.log  # whatever it made is torn down


def test_a_session_left_creating_is_removed_by_the_first_forced_removal() -> None:
    world = World()
    _left_creating(world)

    async def go() -> None:
        await world.service.remove(SID, force=True)
        await world.service.close()

    asyncio.run(go())
    with pytest.raises(NotFound):
        world.store.get(SID)
