"""An approved change puts the agent's new spec, then restarts the agent's running sessions. A
session still starting then had read the old spec: it was left out and ran on with what the
change took away (a revoked mount). Now each start checks the spec once its sandbox is up and
starts over on the new one, and the restart waits for starts under way (creates not yet stored
too) before the change is recorded applied."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from ironclawd.domain.agents import AgentMount, AgentSpec
from ironclawd.domain.changes import ChangeState
from ironclawd.domain.session import State
from ironclawd.services.gateway import Gateway, GatewayPolicy
from ironclawd.services.registry import Registry
from ironclawd.services.sessions import SessionService
from tests.fakes import FakeClock, FakeMounts, MemoryAgents, MemoryChanges, RecordingAudit
from tests.unit.test_session_service import SID, STATE_DIR, World

GRANTS = "/srv/grants"
BUNDLE = STATE_DIR / "bundles" / SID
GRANTED = AgentSpec("demo", mounts=(AgentMount("s", f"{GRANTS}/data"),))


def _world() -> tuple[World, Registry, SessionService]:
    world = World(agent=GRANTED)
    world.mounts.existing.add(f"{GRANTS}/data")
    lifecycle = world.service.lifecycle
    lifecycle.layout = dataclasses.replace(
        lifecycle.layout, mount_allowlist=(GRANTS,), start_timeout=5.0
    )
    registry = Registry(MemoryAgents(), [GRANTED], FakeClock(1000.0))
    service = SessionService(
        store=world.store, lifecycle=lifecycle, agents=registry, hooks=world.hooks,
        audit=world.audit, clock=world.clock,
    )  # fmt: skip
    return world, registry, service


def _gateway(registry: Registry, service: SessionService, restarted: list[list[str]]) -> Gateway:
    async def restart(agent: str) -> list[str]:
        out = await service.restart_agent_sessions(agent)
        restarted.append(out)
        return out

    return Gateway(
        store=MemoryChanges(), registry=registry, audit=RecordingAudit(),
        policy=GatewayPolicy(mount_allowlist=(GRANTS,)), restart_agent_sessions=restart,
        mounts=FakeMounts([f"{GRANTS}/data"]), clock=FakeClock(1000.0),
    )  # fmt: skip


def _mounted(world: World) -> list[str]:
    """The /mnt destinations of the newest bundle written for SID."""
    spec = world.bundles.specs[BUNDLE]
    return [m["destination"] for m in spec["mounts"] if m["destination"].startswith("/mnt")]


async def _until(check: Any) -> None:
    for _ in range(400):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("never happened")


def test_a_revoked_mount_is_gone_from_a_session_that_was_starting_when_it_was_applied() -> None:
    world, registry, service = _world()
    restarted: list[list[str]] = []
    gateway = _gateway(registry, service, restarted)

    async def go() -> None:
        world.control.hello_gate = asyncio.Event()
        creating = asyncio.create_task(service.create("demo", SID))
        # The bundle is written before the unit starts: wait for both (the unit's spec was
        # read too soon in one run of six).
        await _until(lambda: BUNDLE in world.bundles.specs
                     and world.store.get(SID).unit in world.units.specs)  # fmt: skip
        assert world.store.get(SID).state is State.STARTING
        assert _mounted(world) == ["/mnt", "/mnt/s"]
        # A read-only grant is a path the unit's runsc reads (ProtectHome= looks at it).
        unit = world.units.specs[world.store.get(SID).unit]
        assert Path(f"{GRANTS}/data") in unit.readonly_paths
        assert Path(f"{GRANTS}/data") not in unit.writable_paths
        change = gateway.submit("mounts", "demo", '{"mounts": []}', "revoke", "uid:0(root)")
        approving = asyncio.create_task(gateway.approve(change.id, change.hash, "uid:1000(a)"))
        await asyncio.sleep(0.05)
        assert not approving.done()  # "applied" waits for the start under way
        world.control.hello_gate.set()
        applied = await approving
        session = await creating
        assert applied.state is ChangeState.APPLIED
        assert session.state is State.RUNNING
        assert registry["demo"].mounts == ()
        assert "/mnt/s" not in _mounted(world)  # the sandbox of the old spec was replaced
        assert restarted == [[]]  # already on the new spec: not restarted twice
        await service.close()

    asyncio.run(go())


def test_a_create_not_yet_stored_when_the_change_is_applied_ends_on_the_new_spec() -> None:
    world, registry, service = _world()
    restarted: list[list[str]] = []
    gateway = _gateway(registry, service, restarted)

    async def go() -> None:
        change = gateway.submit("mounts", "demo", '{"mounts": []}', "revoke", "uid:0(root)")
        # The create reads the spec now; its task has not run, so no session is stored yet.
        creating = asyncio.create_task(service.create("demo", SID))
        await asyncio.sleep(0)
        assert SID not in {s.sid for s in service.list_sessions()}
        applied = await gateway.approve(change.id, change.hash, "uid:1000(a)")
        assert creating.done()  # waited for
        session = creating.result()
        assert applied.state is ChangeState.APPLIED
        assert session.state is State.RUNNING
        assert "/mnt/s" not in _mounted(world)
        await service.close()

    asyncio.run(go())


def test_running_sessions_are_restarted_and_stopped_ones_left() -> None:
    world, registry, service = _world()

    async def go() -> None:
        await service.create("demo", SID)
        await service.create("demo", "b2u5k8gguri5")
        await service.stop("b2u5k8gguri5")
        registry.put(dataclasses.replace(GRANTED, mounts=()))
        assert await service.restart_agent_sessions("demo") == [SID]
        assert "/mnt/s" not in _mounted(world)
        assert world.store.get("b2u5k8gguri5").state is State.STOPPED
        # Started again on this very spec: nothing left to restart for it.
        assert await service.restart_agent_sessions("demo") == []
        registry.put(dataclasses.replace(GRANTED, mounts=(), persona="New."))
        assert await service.restart_agent_sessions("demo") == [SID]
        await service.close()

    asyncio.run(go())
