"""An idle stop decides on the session's activity when its timer fires, then waits for the
session's lock. Activity while it waited (a message delivered to the agent) did not count: the
stop went ahead once it had the lock and ended the sandbox while its agent answered, the
message left unanswered in the queue until the next one came."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from ironclawd.domain.session import State
from ironclawd.ports import UnitState
from tests.fakes import FakeUnits
from tests.unit.test_session_service import SID, World


class SlowWait(FakeUnits):
    """``wait_inactive`` on a running unit waits (as systemd's does, up to its timeout) until
    ``gate`` opens."""

    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        super().__init__(log)
        self.entered, self.gate = threading.Event(), threading.Event()

    def wait_inactive(self, name: str, timeout: float) -> UnitState | None:
        self.entered.set()
        assert self.gate.wait(5)
        return super().wait_inactive(name, timeout)


def test_activity_while_an_idle_stop_waits_for_the_lock_keeps_the_session_running() -> None:
    world = World(idle_timeout=0.05)
    units = world.units = world.service.lifecycle.units = SlowWait(world.log)
    service = world.service

    async def go() -> None:
        await service.create("demo", SID)
        # The daemon dropped the agent and it connected again: the exit watch holds the
        # session's lock while it waits for the unit (which runs on).
        world.control.drop(SID)
        world.control.reconnect(SID)
        assert await asyncio.to_thread(units.entered.wait, 5)
        world.clock.advance(60)
        await asyncio.sleep(0.2)  # the idle timer fired: its stop waits for the lock
        service.touch(SID)  # a message reached the agent meanwhile
        units.gate.set()
        await asyncio.sleep(0.2)
        assert world.store.get(SID).state is State.RUNNING
        # Idle again, it stops.
        world.clock.advance(60)
        async with asyncio.timeout(5):
            await world.audit.next("session.stopped")
        await service.close()

    asyncio.run(go())
    assert world.store.get(SID).state is State.STOPPED
