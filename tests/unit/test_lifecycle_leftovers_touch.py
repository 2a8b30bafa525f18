"""A touch (a send, an ingested reply) racing a session's removal: ``touch`` kept the session's
activity time before anything checked that the session was still there, so a touch that came
after the removal left an entry for the removed id for good, and raised NotFound into the send
or the ingest that made it. Nothing is kept for a removed session now, and nothing raised."""

from __future__ import annotations

import asyncio

from ironclawd.errors import NotFound
from tests.unit.test_session_service import SID, World


def test_a_touch_after_a_removal_keeps_nothing_for_the_removed_session() -> None:
    world = World(idle_timeout=30.0)
    service = world.service

    async def go() -> None:
        await service.create("demo", SID)
        await service.remove(SID, force=True)
        try:
            service.touch(SID)  # a reply ingested as the removal ended
        except NotFound:
            raised = True  # into the send or the ingest that touched
        else:
            raised = False
        assert SID not in service._last_active
        assert SID not in service._persisted_active
        assert SID not in service._watcher._idle_timers
        assert not raised
        await service.close()

    asyncio.run(go())
