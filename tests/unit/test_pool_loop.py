"""The warm pool's refill loop (services/pool.py) outlives any one failure: nothing starts it
again (``start`` runs once at the daemon's start), so an error escaping it left the pool empty
and every claim a cold start, with nothing in the journal, until a restart."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ironclawd.domain.session import Session
from ironclawd.errors import HostError
from tests.unit.test_pool_bookkeeping import PoolWorld, until


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

    async def go() -> Any:
        world.pool.start()
        try:
            await until(lambda: world.ready() == 2)
        finally:
            await world.pool.close(grace=0.1)
            await world.service.close()

    asyncio.run(go())
    (line,) = [r for r in caplog.records if "pool: refilling" in r.getMessage()]
    assert "disk I/O error" in line.getMessage()
    assert "next try in 1s" in line.getMessage()
