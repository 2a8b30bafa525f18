"""A session's lock is one lock for as long as anyone holds or waits for it. A removal dropped
the lock from the service's table while a command still waited on it: that command then ran
under the dropped lock, and the next command on the same id made a new one and ran beside it
(a stop tore down a sandbox a create was still starting). A command on an id that has no
session left its lock in the table for good."""

from __future__ import annotations

import asyncio

from ironclawd.domain.session import State
from ironclawd.errors import NotFound
from tests.unit.test_session_service import SID, World


async def _until(check: object) -> None:
    for _ in range(400):
        if callable(check) and check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("never happened")


def test_a_command_waiting_through_a_removal_still_excludes_the_next_one() -> None:
    world = World(start_timeout=5.0)
    service = world.service
    removing = asyncio.Event()
    held = asyncio.Event()

    async def hold_removal(sid: str) -> None:
        held.set()
        await removing.wait()

    world.hooks.on_removing(hold_removal)

    async def go() -> None:
        await service.create("demo", SID)
        await service.stop(SID)
        removal = asyncio.create_task(service.remove(SID))
        await held.wait()  # the removal holds the session's lock
        world.control.hello_gate = asyncio.Event()  # the next start waits for its hello
        creating = asyncio.create_task(service.create("demo", SID))  # waits for the removal
        await asyncio.sleep(0.01)
        removing.set()
        await removal
        await _until(lambda: world.store.rows.get(SID) is not None
                     and world.store.get(SID).state is State.STARTING)  # fmt: skip
        stopping = asyncio.create_task(service.stop(SID))
        await asyncio.sleep(0.05)
        # The create still starts its sandbox under the session's lock: the stop waits.
        assert not stopping.done()
        assert world.store.get(SID).state is State.STARTING
        world.control.hello_gate.set()
        assert (await creating).state is State.RUNNING
        assert (await stopping).state is State.STOPPED
        await service.close()

    asyncio.run(go())


def test_no_lock_outlives_the_commands_on_its_session() -> None:
    world = World()
    service = world.service

    async def go() -> None:
        for sid in ("zz0000000001", "zz0000000002"):  # no such session
            for command in (service.start, service.stop, service.remove):
                try:
                    await command(sid)
                except NotFound:
                    pass
                else:
                    raise AssertionError(f"{command.__name__} {sid}: not refused")
        await service.create("demo", SID)
        await service.remove(SID, force=True)
        for _ in range(20):  # the exit watch of the removed sandbox takes the lock too
            await asyncio.sleep(0)
        await service.close()

    asyncio.run(go())
    assert service._locks == {}
