"""A lifecycle command whose end could not be saved, and then neither could its failure (a full
disk: DiskFull, or EIO). ``_guarded`` tore the sandbox down and its save of the failure raised,
so the record kept the state the command had reached: a start or a create left the session
starting (or creating) with no sandbox, and every start answered Conflict until an operator's
stop or the daemon's restart; a stop, an idle stop or the exit watch of a sandbox that died
left it running with no sandbox, and a start answered "running" without starting one. The
service now holds the failure in memory while the disk takes no record (what every command and
listing sees), and the next save of the session that succeeds writes it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.session import Session, State
from ironclawd.errors import DiskFull, HostError
from tests.unit.test_pool_bookkeeping import PoolWorld, until
from tests.unit.test_session_service import SID, World


class FullDisk:
    """The state DB's disk: it fills at the first save ``fills`` picks, and every save after
    fails with DiskFull until ``free``."""

    def __init__(self, world: World, fills: Callable[[Session], bool]) -> None:
        self._save = world.store.save
        self._fills: Callable[[Session], bool] | None = fills
        self.full = False
        world.store.save = self.save  # type: ignore[method-assign]

    def fill_at(self, fills: Callable[[Session], bool]) -> None:
        self._fills = fills

    def save(self, session: Session) -> None:
        if self._fills is not None and self._fills(session):
            self.full, self._fills = True, None
        if self.full:
            raise DiskFull(f"saving session {session.sid}: database or disk is full")
        self._save(session)

    def free(self) -> None:
        self.full, self._fills = False, None


def never(session: Session) -> bool:
    return False


def unit_starts(world: World, sid: str = SID) -> int:
    return world.log.count(("units.start", f"ironclaw-sbx-{sid}.service"))


async def started_again(world: World, disk: FullDisk, sid: str = SID) -> None:
    """What the session is while the disk is full (failed, its sandbox gone), and a start once
    the disk has room: a new sandbox runs, and the record on disk says so."""
    service = world.service
    assert service.get(sid).state is State.FAILED
    assert [s.state for s in service.list_sessions() if s.sid == sid] == [State.FAILED]
    assert not world.units.units.get(f"ironclaw-sbx-{sid}.service")
    starts = unit_starts(world, sid)
    disk.free()
    session = await service.start(sid)
    assert session.state is State.RUNNING
    assert unit_starts(world, sid) == starts + 1
    assert world.store.rows[sid].state is State.RUNNING


def test_a_start_that_could_not_record_running_nor_its_failure_starts_again() -> None:
    world = World()
    service = world.service
    disk = FullDisk(world, never)

    async def go() -> None:
        await service.create("demo", SID)
        await service.stop(SID)
        disk.fill_at(lambda s: s.state is State.RUNNING)
        with pytest.raises(DiskFull):
            await service.start(SID)
        assert world.store.rows[SID].state is State.STARTING  # what the disk holds
        await started_again(world, disk)
        await service.close()

    asyncio.run(go())


def test_a_create_that_could_not_record_starting_nor_its_failure_starts_later() -> None:
    world = World()
    disk = FullDisk(world, lambda s: s.state is State.STARTING)

    async def go() -> None:
        with pytest.raises(DiskFull):
            await world.service.create("demo", SID)
        assert world.store.rows[SID].state is State.CREATING
        await started_again(world, disk)
        await world.service.close()

    asyncio.run(go())


def test_a_claim_of_a_pooled_sandbox_that_could_not_record_starting_starts_later() -> None:
    world = PoolWorld()
    disk = FullDisk(world, never)

    async def go() -> None:
        world.pool.start()
        await until(lambda: world.ready() == 2)
        disk.fill_at(lambda s: s.state is State.STARTING)
        with pytest.raises(DiskFull):
            await world.service.create("demo")
        [claimed] = world.store.rows
        assert ("data.seal", claimed) not in world.log  # no start: the pooled one torn down
        assert world.store.rows[claimed].state is State.CREATING
        assert not world.pool.holds(claimed)
        await started_again(world, disk, claimed)
        await world.pool.close()
        await world.service.close()

    asyncio.run(go())


def test_a_start_whose_running_record_was_not_audited_nor_its_failure_saved_starts_again() -> None:
    """RUNNING saved, its audit record refused (the audit log on the same full disk): the
    sandbox is torn down, and the save of the failure fails too."""
    world = World()
    service = world.service
    disk = FullDisk(world, never)
    record = world.audit.record

    def audit(event: str, actor: str, **fields: Any) -> None:
        if event == "session.running" and fields["sid"] == SID:
            disk.fill_at(lambda s: True)
            raise DiskFull("appending to audit log: No space left on device")
        record(event, actor, **fields)

    world.audit.record = audit  # type: ignore[method-assign]

    async def go() -> None:
        with pytest.raises(DiskFull):
            await service.create("demo", SID)
        assert world.store.rows[SID].state is State.RUNNING
        world.audit.record = record  # type: ignore[method-assign]
        await started_again(world, disk)
        await service.close()

    asyncio.run(go())


def test_a_stop_that_could_not_record_stopping_nor_its_failure_leaves_no_running_record() -> None:
    world = World()
    service = world.service
    disk = FullDisk(world, never)

    async def go() -> None:
        await service.create("demo", SID)
        disk.fill_at(lambda s: True)
        with pytest.raises(DiskFull):
            await service.stop(SID)
        # The teardown dropped the agent's connection: its exit watch runs, the disk full still.
        await asyncio.sleep(0.05)
        assert world.store.rows[SID].state is State.RUNNING
        await started_again(world, disk)
        await service.close()

    asyncio.run(go())


def test_an_idle_stop_that_could_not_record_stopping_leaves_no_running_record() -> None:
    world = World(idle_timeout=0.05)
    service = world.service
    disk = FullDisk(world, never)

    async def go() -> None:
        await service.create("demo", SID)
        disk.fill_at(lambda s: True)
        world.clock.advance(60)
        await until(lambda: ("units.stop", f"ironclaw-sbx-{SID}.service") in world.log)
        await until(lambda: service.get(SID).state is not State.RUNNING)
        assert world.store.rows[SID].state is State.RUNNING
        await started_again(world, disk)
        await service.close()

    asyncio.run(go())


def test_the_exit_watch_of_a_dead_sandbox_that_could_not_record_it_leaves_no_running_record() -> (
    None
):
    world = World()
    service = world.service
    disk = FullDisk(world, never)
    exited = asyncio.Event()

    async def on_exit(sid: str) -> None:
        exited.set()

    world.hooks.on_sandbox_exit(on_exit)

    async def go() -> None:
        await service.create("demo", SID)
        disk.fill_at(lambda s: True)
        world.units.exit(f"ironclaw-sbx-{SID}.service", "oom-kill")
        world.control.drop(SID)
        async with asyncio.timeout(5):
            await exited.wait()
        assert world.store.rows[SID].state is State.RUNNING
        await started_again(world, disk)
        await service.close()

    asyncio.run(go())


def test_a_changes_restart_that_could_not_record_running_nor_its_failure_starts_again() -> None:
    world = World()
    service = world.service
    disk = FullDisk(world, never)

    async def go() -> None:
        await service.create("demo", SID)
        disk.fill_at(lambda s: s.state is State.RUNNING)
        service._agents["demo"] = AgentSpec("demo", persona="New.")  # type: ignore[index]
        assert await service.restart_agent_sessions("demo") == []
        assert world.store.rows[SID].state is State.STARTING
        await started_again(world, disk)
        await service.close()

    asyncio.run(go())


def test_why_a_start_failed_is_logged_when_its_failure_cannot_be_saved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The start's own failure was logged only after its record was saved: with the save
    refused, the journal named the full disk and never why the sandbox did not start."""
    world = World()
    world.units.fail["units.start"] = HostError("StartTransientUnit: access denied")
    FullDisk(world, lambda s: s.state is State.FAILED)

    async def go() -> None:
        with pytest.raises(DiskFull):
            await world.service.create("demo", SID)
        await world.service.close()

    asyncio.run(go())
    assert world.service.get(SID).state is State.FAILED
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("StartTransientUnit: access denied" in line for line in logged), logged
