"""The warm pool's refill loop (services/pool.py) outlives any one failure: nothing starts it
again (``start`` runs once at the daemon's start), so an error escaping it left the pool empty
and every claim a cold start, with nothing in the journal, until a restart."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from ironclawd.domain.pool import PoolConfig
from ironclawd.domain.session import Session
from ironclawd.errors import HostError
from tests.unit.test_pool_bookkeeping import PoolWorld, until


def fill(world: PoolWorld) -> None:
    """Start the pool, let it fill to 2, close it and the service."""

    async def go() -> None:
        world.pool.start()
        try:
            await until(lambda: world.ready() == 2)
        finally:
            await world.pool.close(grace=0.1)
            await world.service.close()

    asyncio.run(go())


def test_a_state_db_error_in_a_refill_is_logged_and_the_pool_fills_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = PoolWorld()
    real_get = world.store.get
    failing = {"left": 1}

    def get(sid: str) -> Session:
        if failing["left"]:  # the pool's check that a fresh id is free (_fresh_sid)
            failing["left"] -= 1
            raise HostError(f"reading session {sid} in state DB: disk I/O error")
        return real_get(sid)

    world.store.get = get  # type: ignore[method-assign]

    fill(world)
    (line,) = [r for r in caplog.records if "pool: refilling" in r.getMessage()]
    assert "disk I/O error" in line.getMessage()
    assert "next try in 1s" in line.getMessage()


# The back-off overflowed a float after 1024 failures in a row (found by a review of this
# stop's diff): 17 h at the 60 s cap, and the loop ended with OverflowError.
def test_the_refill_loop_outlives_a_long_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logging.getLogger("ironclawd.pool"), "disabled", True)
    world = PoolWorld()
    steps = [0]

    many = asyncio.Event()

    async def failing_step() -> None:
        steps[0] += 1
        if steps[0] >= 1100:
            many.set()
        raise HostError("reading session x in state DB: disk I/O error")

    async def no_wait(seconds: float) -> None:
        await asyncio.sleep(0)

    world.pool._step = failing_step  # type: ignore[method-assign]
    world.pool._sleep = no_wait  # type: ignore[method-assign]

    async def go() -> Any:
        task = asyncio.get_running_loop().create_task(world.pool._run())
        await asyncio.wait([task, asyncio.ensure_future(many.wait())], timeout=20,
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        done = task.done()
        exc = task.exception() if done else None
        task.cancel()
        await world.service.close()
        return done, exc

    done, exc = asyncio.run(go())
    assert not done, f"the refill loop ended after {steps[0]} failures: {exc!r}"


# A misspelt agent in [pool] agents gave no pool and no word (found by the config review,
# stop 50); it is named at the start and at a reload, and the known agents still fill.
def test_an_agent_of_pool_agents_the_registry_lacks_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = PoolWorld()
    world.pool.configure(PoolConfig(size=2, agents=("demo", "dmeo"), min_available_bytes=0))

    fill(world)
    named = [r.getMessage() for r in caplog.records if "registry" in r.getMessage()]
    assert named
    assert all(m.startswith("pool: no agent named dmeo in the registry") for m in named)
    caplog.clear()
    world.pool.configure(PoolConfig(size=0, agents=("dmeo",)))  # no pool: nothing to say
    assert not [r for r in caplog.records if "registry" in r.getMessage()]
