"""A stop ends the agent's control connection, and the session's exit watch then waits for the
session's lock to see what happened. A start asked for while the stop ran (a message waking a
session an idle stop is stopping, an operator's start) had queued for that lock first: the
watch of the old sandbox then found the session running again and took the new sandbox for
the one it watched. It waited for that sandbox's unit to end, with the session's lock held
(systemd's wait: the whole stop timeout, 15 s, every command on the session blocked), then
watched the session a second time; had the new agent been between connections then, it would
have stopped the new sandbox and recorded the session failed."""

from __future__ import annotations

import asyncio

from ironclawd.domain.session import State
from tests.unit.test_session_service import SID, World


def test_the_exit_watch_of_a_stopped_sandbox_leaves_the_next_sandbox_alone() -> None:
    world = World()
    service = world.service
    exited: list[str] = []

    async def on_exit(sid: str) -> None:
        exited.append(sid)

    world.hooks.on_sandbox_exit(on_exit)

    async def go() -> None:
        session = await service.create("demo", SID)
        stopping = asyncio.create_task(service.stop(SID))
        starting = asyncio.create_task(service.start(SID))  # queued behind the stop
        assert (await stopping).state is State.STOPPED
        assert (await starting).state is State.RUNNING
        for _ in range(50):  # the old sandbox's exit watch runs after both
            await asyncio.sleep(0.005)
        assert ("units.wait_inactive", session.unit) not in world.log
        assert world.store.get(SID).state is State.RUNNING
        # The new sandbox is watched, once: its death is seen and failed once.
        failed = asyncio.ensure_future(world.audit.next("session.failed"))
        world.units.exit(session.unit, "oom-kill")
        world.control.drop(SID)
        async with asyncio.timeout(5):
            await failed
        for _ in range(50):
            await asyncio.sleep(0.005)
        await service.close()

    asyncio.run(go())
    assert world.store.get(SID).error == "sandbox exited (unit result: oom-kill)"
    assert world.log.count(("units.wait_inactive", f"ironclaw-sbx-{SID}.service")) == 1
    assert exited == [SID]
