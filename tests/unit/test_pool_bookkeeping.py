"""The warm pool's bookkeeping (domain/pool.py, services/pool.py) over the recording fakes of
tests/fakes: a pooled sandbox holds no key, queue or served socket until a session claims it;
a claim is atomic and final (two creates get two sandboxes, none is ever handed out twice); a
failed claim destroys the sandbox; the pool refills, drops what it should not hold, shrinks
while memory is short, and destroys everything it holds when it closes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, cast

import pytest

from ironclawd.domain.pool import WAIT, PoolConfig, Step, next_step
from ironclawd.domain.session import State
from ironclawd.errors import Conflict, SandboxError
from ironclawd.ports import UnitState
from ironclawd.services.pool import WarmPool
from ironclawd.services.sessions import SessionService
from tests.contract.test_inbox_ports import AGENT, real_services
from tests.unit.test_session_service import World

GiB = 1024**3
DEMO = {"demo": object(), "other": object()}


# -- domain/pool.py: what to do next --------------------------------------------------------


def step(config: PoolConfig, ready: dict[str, int], starting: dict[str, int] | None = None,
         available: int = 8 * GiB) -> Step:  # fmt: skip
    return next_step(config, DEMO, ready, starting or {}, available)


def test_the_pool_fills_each_agent_one_sandbox_at_a_time() -> None:
    config = PoolConfig(size=2, agents=("demo", "other"), min_available_bytes=GiB)
    assert step(config, {}) == Step("fill", "demo")
    assert step(config, {"demo": 2}) == Step("fill", "other")
    assert step(config, {"demo": 1}, {"other": 1}) == WAIT  # never two starts at once
    assert step(config, {"demo": 2, "other": 2}) == WAIT
    assert step(PoolConfig(), {}) == WAIT  # size 0: no pool


def test_the_pool_drops_what_it_should_not_hold() -> None:
    config = PoolConfig(size=1, agents=("demo",), min_available_bytes=GiB)
    assert step(config, {"demo": 2}) == Step("drop", "demo")  # shrunk by a reload
    assert step(config, {"demo": 1, "other": 1}) == Step("drop", "other")  # no longer pooled
    assert next_step(config, {}, {"demo": 1}, {}, 8 * GiB) == Step("drop", "demo")  # agent gone


def test_short_memory_stops_refills_and_gives_sandboxes_back() -> None:
    config = PoolConfig(size=2, agents=("demo", "other"), min_available_bytes=GiB)
    assert step(config, {"demo": 1, "other": 2}, available=GiB - 1) == Step("drop", "other")
    assert step(config, {}, available=GiB - 1) == WAIT
    assert step(replace(config, min_available_bytes=0), {}, available=0) == Step("fill", "demo")


# -- services/pool.py over fakes ------------------------------------------------------------


class PoolWorld(World):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.available = 8 * GiB
        self.agents = {"demo": self.agent}
        self.pool = WarmPool(
            lifecycle=self.service.lifecycle, agents=self.agents, records=self.store,
            config=PoolConfig(size=2, agents=("demo",), min_available_bytes=GiB),
            available_bytes=lambda: self.available, clock=self.clock, engage_hold=0,
        )  # fmt: skip
        self.service = SessionService(
            store=self.store, lifecycle=self.service.lifecycle, agents=self.agents,
            hooks=self.hooks, audit=self.audit, clock=self.clock, pool=self.pool,
        )  # fmt: skip

    def ready(self) -> int:
        return dict(self.pool.status()).get("demo", 0)

    def fills(self) -> int:
        """How many pooled sandboxes were begun so far (each fill prepares its data first)."""
        return len([c for c in self.log if c[0] == "data.prepare_pooled"])

    def units_running(self) -> set[str]:
        return {n for n, u in self.units.units.items() if u.active_state == "active"}


async def until(condition: Callable[[], bool]) -> None:
    """Let the pool's loop run until ``condition`` holds (bounded). The pool announces nothing
    a test could await, and its loop only moves when this task yields."""
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110 (no event to wait on: see above)
            await asyncio.sleep(0.001)


def run(world: PoolWorld, body: Callable[[], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        world.pool.start()
        try:
            return await body()
        finally:
            await world.pool.close()
            await world.service.close()

    return asyncio.run(go())


def test_a_pooled_sandbox_holds_nothing_of_a_session_until_claimed() -> None:
    world = PoolWorld()

    async def body() -> tuple[list[str], set[str]]:
        await until(lambda: world.ready() == 2)
        return sorted(world.data.pooled), set(world.units_running())

    pooled, running = run(world, body)
    assert len(pooled) == 2
    assert running == {f"ironclaw-sbx-{sid}.service" for sid in pooled}
    for sid in pooled:  # no key, no control socket listening, no record, not woken
        assert ("data.prepare", sid) not in world.log
        assert ("control.open", sid) not in world.log
        assert ("control.open_claim", sid) in world.log  # the agent waits there
        assert ("control.wake", sid) not in world.log
    assert world.store.list_sessions() == []


def test_concurrent_creates_claim_different_sandboxes_sealed_once_and_the_pool_refills() -> None:
    world = PoolWorld()

    async def body() -> tuple[list[str], list[str]]:
        await until(lambda: world.ready() == 2)
        before = sorted(world.data.pooled)
        a, b = await asyncio.gather(world.service.create("demo"), world.service.create("demo"))
        await until(lambda: world.ready() == 2)
        return before, [a.sid, b.sid]

    before, claimed = run(world, body)
    assert sorted(claimed) == before  # both from the pool, each its own
    for sid in claimed:
        assert world.log.count(("data.seal", sid)) == 1
        # Woken once, and only when its key and control socket are in place.
        assert world.log.count(("control.wake", sid)) == 1
        woken = world.log.index(("control.wake", sid))
        for before_wake in (("data.seal", sid), ("control.open", sid)):
            assert world.log.index(before_wake) < woken, before_wake
        assert world.store.get(sid).state is State.RUNNING
        assert ("units.start", f"ironclaw-sbx-{sid}.service") in world.log  # started once
    # Refilled with new ids; closing the pool stopped those, never the claimed ones.
    refilled = {c[1] for c in world.log if c[0] == "data.prepare_pooled"} - set(claimed)
    assert len(refilled) == 2
    assert {f"ironclaw-sbx-{sid}.service" for sid in claimed} <= world.units_running()
    assert not any(f"ironclaw-sbx-{sid}.service" in world.units_running() for sid in refilled)


def test_a_failed_claim_destroys_the_sandbox_and_never_returns_it() -> None:
    world = PoolWorld()

    async def body() -> str:
        await until(lambda: world.ready() == 2)
        victim = sorted(world.data.pooled)[0]
        world.control.silent.add(victim)  # the agent never says hello
        world.control.silent.update(world.data.pooled)
        with pytest.raises(SandboxError, match="did not connect"):
            await world.service.create("demo")
        return victim

    run(world, body)
    failed = [s for s in world.store.list_sessions() if s.state is State.FAILED]
    assert len(failed) == 1
    sid = failed[0].sid
    assert f"ironclaw-sbx-{sid}.service" not in world.units_running()
    assert sid not in world.netns.names
    assert sid not in world.control.list_dirs()
    assert not world.pool.holds(sid)


def test_an_explicit_sid_cannot_take_a_pooled_one_and_gets_a_cold_sandbox() -> None:
    world = PoolWorld()

    async def body() -> str:
        await until(lambda: world.ready() == 2)
        held = sorted(world.data.pooled)[0]
        with pytest.raises(Conflict, match="taken"):
            await world.service.create("demo", held)
        cold = await world.service.create("demo", "explicit01")
        assert world.ready() == 2  # no claim
        return cold.sid

    assert run(world, body) == "explicit01"
    assert ("data.prepare", "explicit01") in world.log


def test_a_changed_agent_spec_is_not_served_from_the_old_pool() -> None:
    world = PoolWorld()

    async def body() -> tuple[set[str], str]:
        await until(lambda: world.ready() == 2)
        stale = set(world.data.pooled)
        world.agents["demo"] = replace(world.agent, max_tokens=77)
        session = await world.service.create("demo")
        await until(lambda: not (stale & world.data.pooled))
        return stale, session.sid

    stale, sid = run(world, body)
    assert sid not in stale  # cold: the stale sandboxes were destroyed, none claimed
    assert ("data.prepare", sid) in world.log
    for old in stale:
        assert ("data.destroy", old) in world.log


def test_the_pool_shrinks_while_memory_is_short_and_closing_destroys_all() -> None:
    world = PoolWorld()

    async def body() -> set[str]:
        await until(lambda: world.ready() == 2)
        world.available = 0
        world.pool.configure(world.pool._config)  # wake it now rather than at its next look
        await until(lambda: world.ready() == 0)
        world.available = 8 * GiB
        world.pool.configure(world.pool._config)
        await until(lambda: world.ready() == 2)
        return set(world.data.pooled)

    last = run(world, body)
    assert len(last) == 2
    assert world.data.pooled == set()  # closed: every queue dir and key file removed
    assert world.units_running() == set()
    assert not world.netns.names
    assert world.control.list_dirs() == []


def test_a_sandbox_that_died_in_the_pool_is_replaced_by_a_cold_start() -> None:
    world = PoolWorld()

    async def body() -> str:
        await until(lambda: world.ready() == 2)
        # Their agents' connections are not seen (as if they polled their key files), so a
        # claim asks systemd, which says the units are gone.
        world.control.claim_waiters.clear()
        for sid in world.data.pooled:
            world.units.exit(f"ironclaw-sbx-{sid}.service", "signal")
        return (await world.service.create("demo")).sid

    sid = run(world, body)
    assert world.store.get(sid).state is State.RUNNING
    assert ("data.prepare", sid) in world.log  # started cold under the claimed id
    assert ("data.seal", sid) not in world.log


def test_a_claim_asks_systemd_only_when_no_agent_waits_on_the_claim_socket() -> None:
    world = PoolWorld()
    asked: list[str] = []
    list_units = world.units.list_units

    def recording(pattern: str) -> list[UnitState]:
        asked.append(pattern)
        return list_units(pattern)

    world.units.list_units = recording  # type: ignore[method-assign]

    async def body() -> tuple[str, set[str]]:
        await until(lambda: world.ready() == 2)
        waiting, other = sorted(world.data.pooled)
        # Its agent waits on claim.sock; the other's connection is not seen (its agent polls
        # its key file: a pooled sandbox is ready only once its agent waited, so it did once).
        world.control.claim_waiters.discard(other)
        created = {(await world.service.create("demo")).sid for _ in range(2)}
        return waiting, created

    waiting, created = run(world, body)
    assert waiting in created
    (polling,) = created - {waiting}
    for sid in created:
        assert world.store.get(sid).state is State.RUNNING
        assert ("data.seal", sid) in world.log  # both claimed from the pool
    assert f"ironclaw-sbx-{waiting}.service" not in asked  # its connection said it runs
    assert f"ironclaw-sbx-{polling}.service" in asked  # no connection: systemd was asked


def test_a_sandbox_whose_waiting_agent_died_is_replaced_before_anyone_claims_it() -> None:
    world = PoolWorld()

    async def body() -> tuple[str, set[str], str]:
        await until(lambda: world.ready() == 2)
        dead = sorted(world.data.pooled)[0]
        world.control.claim_waiters.add(dead)  # its agent waited on claim.sock
        world.control.lose_claim(dead)  # and its connection ended
        await until(lambda: ("data.destroy", dead) in world.log and world.ready() == 2)
        ready_now = set(world.data.pooled)
        return dead, ready_now, (await world.service.create("demo")).sid

    dead, ready_now, sid = run(world, body)
    assert dead not in ready_now  # destroyed, and another started in its place
    assert ("units.stop", f"ironclaw-sbx-{dead}.service") in world.log
    assert sid != dead  # the next create got a live one from the pool
    assert sid in ready_now
    assert ("data.seal", sid) in world.log
    assert world.store.get(sid).state is State.RUNNING
    world.control.made_dirs.add("nopooled0001")  # a claim socket the pool does not know of
    world.control.claim_waiters.add("nopooled0001")
    world.control.lose_claim("nopooled0001")  # not in the pool: nothing to do


def test_the_pool_refills_only_once_a_claim_is_done() -> None:
    world = PoolWorld()

    async def body() -> tuple[int, int]:
        await until(lambda: world.ready() == 2)
        gate = world.control.hello_gate = asyncio.Event()  # the claimed agent is slow to answer
        creating = asyncio.create_task(world.service.create("demo"))
        await until(lambda: world.ready() == 1)
        for _ in range(50):  # the loop runs meanwhile, and starts nothing
            await asyncio.sleep(0.001)
        during = world.fills()
        gate.set()
        await creating
        await until(lambda: world.ready() == 2)
        return during, world.fills()

    during, after = run(world, body)
    assert (during, after) == (2, 3)


def test_the_refill_waits_for_the_claimed_sessions_first_reply() -> None:
    """Starting a sandbox takes about a core for a second: begun at once, it tripled the first
    reply of the session that had just claimed. It waits for that reply (``answered``)."""
    world = PoolWorld()
    world.pool._engage_hold = 60.0

    async def body() -> tuple[int, int]:
        await until(lambda: world.ready() == 2)
        sid = (await world.service.create("demo")).sid
        for _ in range(50):  # the loop runs meanwhile, and starts nothing
            await asyncio.sleep(0.001)
        waiting = world.fills()
        world.service.answered("someoneelse1")  # another session's reply changes nothing
        for _ in range(50):
            await asyncio.sleep(0.001)
        assert world.fills() == waiting
        world.service.answered(sid)
        await until(lambda: world.ready() == 2)
        return waiting, world.fills()

    assert run(world, body) == (2, 3)


def test_without_a_reply_the_refill_waits_only_the_hold() -> None:
    world = PoolWorld()
    world.pool._engage_hold = 0.05  # seconds of the world's clock; the loop sleeps as long

    async def body() -> tuple[int, int]:
        await until(lambda: world.ready() == 2)
        await world.service.create("demo")
        for _ in range(50):
            await asyncio.sleep(0.001)
        held = world.fills()
        world.clock.advance(0.05)
        await until(lambda: world.ready() == 2)
        return held, world.fills()

    assert run(world, body) == (2, 3)


def test_a_failed_claim_is_not_waited_for() -> None:
    world = PoolWorld()
    world.pool._engage_hold = 60.0

    async def body() -> None:
        await until(lambda: world.ready() == 2)
        world.control.silent.update(world.data.pooled)  # the claimed agent never says hello
        with pytest.raises(SandboxError, match="did not connect"):
            await world.service.create("demo")
        world.control.silent.clear()
        await until(lambda: world.ready() == 2)  # refilled without any reply

    run(world, body)


def test_a_reply_the_message_service_takes_in_tells_the_pool() -> None:
    sessions, messages, data, control, clock = real_services()
    told: list[str] = []

    class Pool:  # what the session service asks of its pool here
        def claim(self, spec: object) -> None:
            return None

        def holds(self, sid: str) -> bool:
            return False

        def answered(self, sid: str) -> None:
            told.append(sid)

    sessions.pool = cast(WarmPool, Pool())

    async def body() -> str:
        sid = (await sessions.create(AGENT)).sid
        sent = await messages.send(sid, "hello")
        assert told == []  # a send is not an answer
        data.outbound_rows[sid] = [(1, sent.seq, clock.time(), b"hi")]
        assert control.listener is not None
        await control.listener(sid, "outbound", 1)
        await sessions.close()
        return sid

    assert told == [asyncio.run(body())]


def test_a_pooled_sandbox_is_ready_only_once_its_agent_waits_for_a_claim() -> None:
    """Not when runsc was started: a claim made while the agent still booted found the claim
    socket gone and cost 5 s (the agent's retries, then its key file)."""
    world = PoolWorld()
    gate = asyncio.Event()
    wait_claim = world.control.wait_claim

    async def booting(sid: str) -> None:
        await gate.wait()  # the agent has not connected to claim.sock yet
        await wait_claim(sid)

    world.control.wait_claim = booting  # type: ignore[method-assign]

    async def body() -> tuple[int, int]:
        await until(lambda: any(c[0] == "units.start" for c in world.log))
        for _ in range(50):
            await asyncio.sleep(0.001)
        booted = world.ready()
        gate.set()
        await until(lambda: world.ready() == 2)
        return booted, world.ready()

    assert run(world, body) == (0, 2)
