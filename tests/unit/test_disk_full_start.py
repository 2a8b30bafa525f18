"""A full disk while the daemon starts: the audit record of what was done is logged when it
cannot be written, never a reason to undo the work or to end the daemon (found by a review)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ironclawd import daemon as daemon_module
from ironclawd.domain.session import State
from ironclawd.errors import DiskFull
from ironclawd.services.reconcile import ReconcileReport, Recovery, reconcile
from tests.unit.test_session_service import SID, World, _left_running, _run


def test_a_full_audit_disk_does_not_tear_down_a_sandbox_that_was_adopted() -> None:
    world = World()
    session = _left_running(world)
    world.log.clear()
    real = world.audit.record

    def record(event: str, actor: str, **fields: Any) -> None:
        if event == "session.adopted":
            raise DiskFull(
                "appending to audit log: No space left on device; the record was not written"
            )
        real(event, actor, **fields)

    world.audit.record = record  # type: ignore[method-assign]

    async def go() -> list[str]:
        return (await reconcile(world.service)).adopted

    adopted = _run(world, go())
    torn_down = ("units.stop", session.unit) in world.log
    assert adopted == [SID], f"error={world.store.get(SID).error!r}"
    assert not torn_down
    assert world.store.get(SID).state is State.RUNNING


class _Audit:
    def record(self, event: str, actor: str, **fields: Any) -> None:
        raise DiskFull(
            "appending to audit log /var/lib/ironclaw/audit.log: No space left on "
            "device; the record was not written"
        )


def test_a_full_audit_disk_after_ready_does_not_end_the_daemon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def reconcile(sessions: Any, recovery: Any) -> ReconcileReport:
        return ReconcileReport()

    monkeypatch.setattr(daemon_module, "reconcile", reconcile)
    monkeypatch.setattr(daemon_module, "_notify", lambda **kw: None)
    channels_started: list[str] = []

    async def nothing(*a: Any) -> None:
        return None

    async def start() -> None:
        channels_started.append("started")

    wired = SimpleNamespace(
        control=SimpleNamespace(discard_restored=lambda: None),
        sessions=SimpleNamespace(pool=None),
        gateway=SimpleNamespace(resume=nothing),
        audit=_Audit(),
        messages=SimpleNamespace(resume_all=nothing),
        inbox=SimpleNamespace(resume=nothing, start=start),
    )
    config = SimpleNamespace(admin=SimpleNamespace(socket=Path("/run/ironclaw/admin.sock")))
    d = daemon_module.Daemon(Path("/etc/ironclaw/ironclawd.toml"), config)  # type: ignore[arg-type]

    async def go() -> str:
        # The shape of Daemon.run's TaskGroup: the stop wait beside _recover.
        stop = asyncio.Event()
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(d._recover(wired, Recovery()))  # type: ignore[arg-type]
                try:
                    await asyncio.wait_for(stop.wait(), 1.0)
                except TimeoutError:
                    return "still serving"
        except BaseExceptionGroup as group:
            return f"daemon.run ends: {group.exceptions!r}"
        return "stopped"

    outcome = asyncio.run(go())
    assert outcome == "still serving"
    assert channels_started
