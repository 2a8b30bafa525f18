"""The daemon's stop closes the session service: commands in flight get the stop timeout, then
are cancelled, and running sandboxes are left for the next start to adopt. A command asked for
after that (an approved change's restart, applied in a task of the gateway's that the stop does
not cancel, went on once the create it waited for was cancelled) ran in a task nobody owned
any more: never cancelled nor awaited, it tore down a sandbox the next start would have adopted
and started another while the daemon closed its sockets and its state DB. Such a command is
now cancelled at once, as the commands in flight were (the change stays approved, and the next
start's resume restarts its sessions)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.session import State
from ironclawd.services.sessions import SessionService
from tests.unit.test_session_service import SID, World

OTHER = "b2u5k8gguri5"


def test_a_restart_that_goes_on_after_the_service_closed_leaves_the_sandboxes_alone() -> None:
    world = World(start_timeout=5.0)
    lifecycle = world.service.lifecycle
    lifecycle.layout = dataclasses.replace(lifecycle.layout, stop_timeout=0.1)
    agents = {"demo": AgentSpec("demo")}
    service = SessionService(
        store=world.store, lifecycle=lifecycle, agents=agents, hooks=world.hooks,
        audit=world.audit, clock=world.clock,
    )  # fmt: skip

    async def go() -> None:
        running = await service.create("demo", SID)
        world.control.hello_gate = asyncio.Event()  # the next create waits for its hello
        creating = asyncio.create_task(service.create("demo", OTHER))
        await asyncio.sleep(0.05)
        agents["demo"] = AgentSpec("demo", persona="New.")  # an approved change put it
        restarting = asyncio.create_task(service.restart_agent_sessions("demo"))
        await asyncio.sleep(0.05)
        assert not restarting.done()  # it waits for the create
        await service.close()  # the create is cancelled after the stop timeout
        with pytest.raises(asyncio.CancelledError):
            await creating
        await asyncio.sleep(0.2)
        assert ("units.stop", running.unit) not in world.log
        assert world.store.get(SID).state is State.RUNNING  # left for the next start to adopt
        assert restarting.done()
        with pytest.raises(asyncio.CancelledError):
            restarting.result()

    asyncio.run(go())
