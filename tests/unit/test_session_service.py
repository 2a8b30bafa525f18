"""SessionService over recording fakes and a hand-driven clock (tests/fakes): a failed start
rolls back every host resource it made, in reverse order; reconcile adopts a running sandbox
(or tears it down if its agent never reconnects) and removes orphans; a sandbox that dies is
recorded failed; an idle session stops by itself."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ironclawd.domain.agents import AgentMount, AgentSpec
from ironclawd.domain.session import Session, State
from ironclawd.domain.skills import AgentSkill, SkillFile
from ironclawd.errors import HostError, SandboxError
from ironclawd.host.skills import skill_set_digest
from ironclawd.ports import UnitSpec
from ironclawd.services.reconcile import reconcile
from ironclawd.services.session_hooks import SessionHooks
from ironclawd.services.session_lifecycle import SandboxLayout, SandboxLifecycle
from ironclawd.services.sessions import SessionService
from tests.fakes import (
    FakeBundles,
    FakeClock,
    FakeControl,
    FakeMounts,
    FakeNetns,
    FakeRuntime,
    FakeSessionData,
    FakeUnits,
    MemorySessions,
    RecordingAudit,
)

SID = "a2u5k8gguri5"
STATE_DIR = Path("/var/lib/ironclaw")


@dataclass
class World:
    idle_timeout: float = 0.0
    start_timeout: float = 0.2  # the fake agent says hello at once, or never (silent)
    agent: AgentSpec = field(default_factory=lambda: AgentSpec("demo"))
    log: list[tuple[Any, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.clock = FakeClock()
        self.store = MemorySessions()
        self.units = FakeUnits(self.log)
        self.netns = FakeNetns(self.log)
        self.control = FakeControl(self.log)
        self.runtime = FakeRuntime(self.log)
        self.data = FakeSessionData(self.log)
        self.mounts = FakeMounts(log=self.log)
        self.bundles = FakeBundles(self.log)
        self.hooks = SessionHooks()
        self.audit = RecordingAudit()
        layout = SandboxLayout(
            bundles_dir=STATE_DIR / "bundles",
            rootfs=STATE_DIR / "rootfs" / "x",
            start_timeout=self.start_timeout,
            adopt_timeout=0.2,
            unit_check_seconds=0.01,
            idle_timeout=self.idle_timeout,
            state_dir=STATE_DIR,
        )
        lifecycle = SandboxLifecycle(
            units=self.units, netns=self.netns, control=self.control, runtime=self.runtime,
            layout=layout, data=self.data, mounts=self.mounts, bundles=self.bundles,
            sockets=self.hooks,
        )  # fmt: skip
        self.service = SessionService(
            store=self.store, lifecycle=lifecycle, agents={"demo": self.agent},
            hooks=self.hooks, audit=self.audit, clock=self.clock,
        )  # fmt: skip

    def effects(self) -> list[str]:
        return [str(call[0]) for call in self.log]


@pytest.fixture
def world() -> World:
    return World()


def _run(world: World, coro: Any) -> Any:
    async def go() -> Any:
        try:
            return await coro
        finally:
            await world.service.close()

    return asyncio.run(go())


MADE = ["control.open", "netns.create", "data.prepare", "bundles.write", "units.start"]
# Once the unit runs, its process holds the netns: the name is released at once.
STARTED = [*MADE, "netns.delete"]
UNDONE = ["units.stop", "units.reset_failed", "runtime.delete", "bundles.remove",
          "mounts.remove_frame", "data.release", "netns.delete", "control.close"]  # fmt: skip


def test_a_start_that_fails_rolls_back_everything_it_made_in_reverse(world: World) -> None:
    world.units.fail["units.start"] = HostError("StartTransientUnit: access denied")
    with pytest.raises(SandboxError, match=r"starting session .*: StartTransientUnit: access"):
        _run(world, world.service.create("demo", SID))
    assert world.effects() == MADE + UNDONE
    session = world.store.get(SID)
    assert session.state is State.FAILED
    assert "access denied" in session.error
    assert world.audit.events() == ["session.created", "session.starting", "session.failed"]
    assert not world.netns.names
    assert not world.control.open_dirs
    assert not world.data.prepared
    assert not world.bundles.specs
    assert not world.units.units


def test_an_agent_that_never_says_hello_is_rolled_back_too(world: World) -> None:
    world.control.silent.add(SID)
    with pytest.raises(SandboxError, match="did not connect to its control socket in time"):
        _run(world, world.service.create("demo", SID))
    assert world.effects() == STARTED + UNDONE
    assert world.store.get(SID).state is State.FAILED
    # The unit that ran is stopped and reset (nothing of it stays loaded); the runsc state it
    # left is deleted.
    assert f"ironclaw-sbx-{SID}.service" not in world.units.units
    assert not world.runtime.ids


def test_a_unit_that_ends_before_the_hello_fails_the_start_at_once_and_says_why() -> None:
    # runsc could not make the sandbox (seen past ~290 sessions: the slice out of tasks, "fork/
    # exec /proc/self/exe: resource temporarily unavailable"): the unit fails within a second.
    # The start fails then, naming the unit's result, not 30 s later as a silent agent.
    world = World(start_timeout=60.0)
    world.control.silent.add(SID)
    world.units.dies_at_start[f"ironclaw-sbx-{SID}.service"] = "exit-code"

    # (Had the wait run to its deadline, the error would say "did not connect ... in time".)
    with pytest.raises(SandboxError) as failed:
        _run(world, world.service.create("demo", SID))
    assert str(failed.value) == (
        f"starting session {SID}: sandbox unit ironclaw-sbx-{SID}.service ended (result: "
        "exit-code) before its agent connected"
    )
    assert world.effects() == STARTED + UNDONE
    session = world.store.get(SID)
    assert session.state is State.FAILED
    assert "ended (result: exit-code)" in session.error
    assert not world.units.units  # the failed unit was reset, not left holding its name


def test_a_started_session_runs_and_stop_tears_down_what_start_made(world: World) -> None:
    names_while_running: set[str] = set()

    async def go() -> tuple[Session, Session]:
        running = await world.service.create("demo", SID)
        names_while_running.update(world.netns.names)
        return running, await world.service.stop(SID)

    running, stopped = _run(world, go())
    assert (running.state, running.platform) == (State.RUNNING, "fake")
    assert stopped.state is State.STOPPED
    assert world.effects()[: len(STARTED)] == STARTED
    assert not names_while_running  # a running session keeps no netns name (no host mount)
    assert {"units.stop", "runtime.delete", "netns.delete", "bundles.remove", "data.release",
            "control.close"} <= set(world.effects()[len(MADE):])  # fmt: skip
    assert not world.netns.names
    assert not world.control.open_dirs
    assert not world.data.prepared


def _left_running(world: World) -> Session:
    """What a killed daemon leaves: a running record, its unit, netns and runsc state (the
    netns with its name, as an earlier version of the daemon kept it)."""
    session = Session(SID, "demo", State.RUNNING, 1.0, 1.0, 1.0, platform="fake")
    world.store.rows[SID] = session
    world.units.units[session.unit] = world.units.start_transient(_spec(session.unit), 1.0)
    world.netns.names.add(session.netns)
    world.runtime.ids.add(session.container_id)
    world.log.clear()
    return session


def _spec(name: str) -> UnitSpec:
    return UnitSpec(name=name, argv=["x"], description="", netns_path=None)


def test_an_agents_skills_are_written_once_and_bound_read_only_at_skills() -> None:
    files = (SkillFile("SKILL.md", hashlib.sha256(b"body").hexdigest(), "body"),)
    skill = AgentSkill("notes", "1.0", "Takes notes.", "0" * 16, "0" * 64, files)
    world = World(agent=AgentSpec("demo", skills=(skill,)))
    _run(world, world.service.create("demo", SID))
    # Written before the frame and the bundle: a refused set leaves nothing behind.
    assert world.effects()[:4] == ["control.open", "netns.create", "data.prepare",
                                   "mounts.skill_set"]  # fmt: skip
    (spec,) = world.bundles.specs.values()
    (mount,) = [m for m in spec["mounts"] if m["destination"] == "/skills"]
    assert mount["source"] == str(STATE_DIR / "skills" / skill_set_digest((skill,)))
    assert mount["options"] == ["rbind", "ro", "nosuid", "nodev", "noexec"]
    plain = World()
    _run(plain, plain.service.create("demo", SID))
    (spec,) = plain.bundles.specs.values()
    assert "/skills" not in [m["destination"] for m in spec["mounts"]]
    assert "mounts.skill_set" not in plain.effects()


def test_reconcile_adopts_a_running_sandbox_whose_agent_reconnects(world: World) -> None:
    session = _left_running(world)
    orphan = "ironclaw-sbx-zzzzzzzzzzzz.service"
    world.units.units[orphan] = world.units.start_transient(_spec(orphan), 1.0)
    world.log.clear()

    async def go() -> tuple[list[str], list[str]]:
        report = await reconcile(world.service)
        return report.adopted, report.removed

    adopted, removed = _run(world, go())
    assert adopted == [SID]
    assert world.store.get(SID).state is State.RUNNING
    # Its netns name is released (the sandbox holds the namespace), not counted as an orphan.
    assert not world.netns.names
    assert ("netns.delete", session.netns) in world.log
    assert not [r for r in removed if SID in r]
    assert "session.adopted" in world.audit.events()
    assert ("control.open", SID) in world.log
    assert ("units.stop", orphan) in world.log  # an orphan unit is removed
    assert ("units.stop", session.unit) not in world.log  # the adopted one is not


def test_reconcile_tears_down_a_sandbox_whose_agent_does_not_reconnect(world: World) -> None:
    session = _left_running(world)
    world.control.silent.add(SID)

    async def go() -> tuple[list[str], list[str]]:
        report = await reconcile(world.service)
        return report.adopted, report.settled

    assert _run(world, go()) == ([], [SID])
    failed = world.store.get(SID)
    assert failed.state is State.FAILED
    assert "adopting session" in failed.error
    assert {("units.stop", session.unit), ("netns.delete", session.netns),
            ("runtime.delete", session.container_id)} <= set(world.log)  # fmt: skip
    assert not world.netns.names


def _exit_hooks_heard(world: World) -> list[str]:
    """The sessions the world's sandbox-exit hooks are called for, in order."""
    exited: list[str] = []

    async def on_exit(sid: str) -> None:
        exited.append(sid)

    world.hooks.on_sandbox_exit(on_exit)
    return exited


def test_an_adopted_sandbox_that_dies_is_recorded_failed_and_hooks_run(world: World) -> None:
    session = _left_running(world)
    exited = _exit_hooks_heard(world)

    async def go() -> None:
        await reconcile(world.service)
        world.units.exit(session.unit, "oom-kill")
        failed = asyncio.ensure_future(world.audit.next("session.failed"))
        world.control.drop(SID)
        async with asyncio.timeout(5):
            await failed

    _run(world, go())
    dead = world.store.get(SID)
    assert (dead.state, dead.error) == (State.FAILED, "sandbox exited (unit result: oom-kill)")
    assert exited == [SID]


def test_an_agent_that_drops_its_connection_and_runs_on_is_stopped_failed(world: World) -> None:
    """The watch waits for the unit to end once the agent's connection drops. A box that closed
    its connection and kept running made that wait time out: the error was swallowed, nothing
    watched the session again, and when the sandbox later died the session stayed running
    with no unit (found by a review). The session is now stopped and recorded failed."""
    exited = _exit_hooks_heard(world)

    async def go() -> None:
        session = await world.service.create("demo", SID)
        failed = asyncio.ensure_future(world.audit.next("session.failed"))
        world.control.drop(SID)  # the unit keeps running
        async with asyncio.timeout(5):
            await failed
        assert ("units.stop", session.unit) in world.log

    _run(world, go())
    dead = world.store.get(SID)
    assert dead.state is State.FAILED
    assert "closed its control connection and its sandbox kept running" in dead.error
    assert exited == [SID]


def test_an_agent_dropped_by_the_daemon_that_reconnects_is_watched_again(world: World) -> None:
    """The daemon drops an agent that stops reading its control lines (``send``'s timeout),
    and the agent connects again: its sandbox lives. The exit watch's wait then timed out, and
    the session was failed as if the agent had left (found by a review of the rule above)."""
    exited = _exit_hooks_heard(world)

    async def go() -> None:
        session = await world.service.create("demo", SID)
        world.control.drop(SID)
        world.control.reconnect(SID)
        for _ in range(500):  # the exit watch's wait runs in a worker thread
            if ("units.wait_inactive", session.unit) in world.log:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert world.store.get(SID).state is State.RUNNING
        # Watched again: when it dies now, that is seen.
        world.units.exit(session.unit, "oom-kill")
        failed = asyncio.ensure_future(world.audit.next("session.failed"))
        world.control.drop(SID)
        async with asyncio.timeout(5):
            await failed

    _run(world, go())
    assert world.store.get(SID).error == "sandbox exited (unit result: oom-kill)"
    assert exited == [SID]


@pytest.mark.parametrize("how", ["stop", "remove"])
def test_no_exit_hook_runs_for_a_sandbox_the_operator_ended(world: World, how: str) -> None:
    """The agent's connection also drops when a stop or a removal ends its sandbox; that is
    not a death. A removed session's hooks ran anyway (its record was gone, so no state said
    otherwise): messaging then looked for unanswered messages under a destroyed key and
    warned at every ``session rm``."""
    exited = _exit_hooks_heard(world)

    async def go() -> None:
        await world.service.create("demo", SID)
        if how == "stop":
            await world.service.stop(SID)
        else:
            await world.service.remove(SID, force=True)
        for _ in range(20):  # the watcher's disconnect callback runs after the call returns
            await asyncio.sleep(0)

    _run(world, go())
    assert exited == []


def test_an_idle_session_stops_by_itself_after_the_idle_timeout() -> None:
    world = World(idle_timeout=0.01)

    async def go() -> None:
        await world.service.create("demo", SID)
        world.clock.advance(60)  # no activity for a minute, by the injected clock
        async with asyncio.timeout(5):
            await world.audit.next("session.stopped")

    _run(world, go())
    assert world.store.get(SID).state is State.STOPPED
    assert world.audit.events()[-2:] == ["session.stopping", "session.stopped"]


def test_activity_keeps_an_idle_timer_from_stopping_a_session() -> None:
    world = World(idle_timeout=0.01)

    async def go() -> None:
        await world.service.create("demo", SID)
        stopped = world.audit.next("session.stopped")
        world.service.touch(SID)  # activity now: idle for 0 s when the timer fires
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):  # many idle timeouts, no stop
                await stopped

    _run(world, go())
    assert world.store.get(SID).state is State.RUNNING


def test_a_start_cancelled_while_systemd_starts_the_unit_is_undone_after_that_start() -> None:
    """A stop of the daemon cancels a start in flight; the unit's start goes on in its worker
    thread. The undo waits for it, so the unit is stopped after systemd has it (not before, to
    start with no record afterwards) and what was handed to the start is not closed under it."""

    class SlowStart(FakeUnits):
        def __init__(self, log: list[tuple[Any, ...]]) -> None:
            super().__init__(log)
            self.entered, self.gate = threading.Event(), threading.Event()

        def start_transient(self, spec: UnitSpec, timeout: float) -> Any:
            self.entered.set()
            assert self.gate.wait(5)
            return super().start_transient(spec, timeout)

    world = World()
    units = world.units = world.service.lifecycle.units = SlowStart(world.log)
    session = Session(SID, "demo", State.STARTING, 0.0, 0.0, 0.0)

    async def go() -> None:
        starting = asyncio.ensure_future(world.service.lifecycle.bring_up(session, world.agent))
        assert await asyncio.to_thread(units.entered.wait, 5)
        starting.cancel()
        await asyncio.sleep(0.05)
        assert not starting.done()  # it waits for the unit's start
        units.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await starting

    asyncio.run(go())
    effects = world.effects()
    assert effects.index("units.start") < effects.index("units.stop")
    assert f"ironclaw-sbx-{SID}.service" not in world.units.units or (
        world.units.units[f"ironclaw-sbx-{SID}.service"].active_state == "inactive"
    )


def test_a_start_refuses_a_grant_below_another_agents_writable_grant() -> None:
    """Approved apart (the writer's grant after this one's), two agents' grants may nest: the
    start of the one below refuses, naming why, and makes nothing (stop 47's review: the
    writer could put a symlink in place of the directory below between check and mount)."""
    world = World(agent=AgentSpec("demo", mounts=(AgentMount("s", "/srv/grants/a/sub"),)))
    world.mounts.existing.add("/srv/grants/a/sub")
    world.service.lifecycle.layout = dataclasses.replace(
        world.service.lifecycle.layout, mount_allowlist=("/srv/grants",)
    )
    writer = AgentSpec("writer", mounts=(AgentMount("a", "/srv/grants/a", read_only=False),))
    world.service.lifecycle.agents = {"demo": world.agent, "writer": writer}
    with pytest.raises(SandboxError, match="below /srv/grants/a, which agent 'writer' may write"):
        _run(world, world.service.create("demo", SID))
    assert "units.start" not in world.effects()
    assert not world.netns.names
