"""A session's host resources: made in order inside one AsyncExitStack and kept only if the
agent says hello (any failure rolls all of them back), torn down in reverse, safe to repeat."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ironclawd import paths
from ironclawd.bundle.grants import frame_dir, granted_mounts
from ironclawd.bundle.skills import skill_sets_dir, skills_mount
from ironclawd.bundle.spec import SOCKETS_DIR, build_spec, session_mounts
from ironclawd.domain.agents import AgentSpec, grant_overlap
from ironclawd.domain.policy import Mount, SandboxPolicy
from ironclawd.domain.session import Session
from ironclawd.errors import IronclawError, PolicyDenied, SandboxError
from ironclawd.ports import (
    AgentHello,
    Bundles,
    ControlPlane,
    JournalReader,
    MountSources,
    NetnsManager,
    PackageImages,
    SandboxRuntime,
    SandboxSockets,
    SessionData,
    UnitManager,
    UnitSpec,
)

log = logging.getLogger("ironclawd.sessions")
_T = TypeVar("_T")

AGENT_ARGV = ("/app/agent/agent",)
# While waiting for an agent's hello, how soon its unit is first checked (the interval then
# doubles): a sandbox that runsc could not start (the slice out of tasks, a refused spec) fails
# the wait at once, not at the deadline.
UNIT_CHECK_SECONDS = 0.25
UNIT_CHECK_MAX_FACTOR = 8  # checks at 0.25, 0.75, 1.75, 3.75 s, then every 2 s
LAST_OUTPUT_CHARS = 300


@dataclass(frozen=True)
class SandboxLayout:
    bundles_dir: Path
    rootfs: Path
    start_timeout: float = 30.0
    stop_timeout: float = 15.0
    adopt_timeout: float = 20.0
    idle_timeout: float = 0.0  # 0: never stop idle sessions
    mount_allowlist: tuple[str, ...] = ()  # [gateway] mount_allowlist, re-checked at each start
    state_dir: Path = paths.STATE_DIR  # [daemon] state_dir: queues and mount frames live there
    unit_check_seconds: float = UNIT_CHECK_SECONDS


class SandboxLifecycle:
    """Brings a session's sandbox up and tears it down; knows nothing of its persisted state."""

    def __init__(
        self,
        *,
        units: UnitManager,
        netns: NetnsManager,
        control: ControlPlane,
        runtime: SandboxRuntime,
        layout: SandboxLayout,
        data: SessionData,
        mounts: MountSources,
        bundles: Bundles,
        sockets: SandboxSockets,
        images: PackageImages | None = None,
        journal: JournalReader | None = None,
        agents: Mapping[str, AgentSpec] | None = None,
    ) -> None:
        self.units = units
        self.netns = netns
        self.control = control
        self.runtime = runtime
        self.layout = layout
        self.data = data
        self.mounts = mounts
        self.bundles = bundles
        self.sockets = sockets
        self.images = images
        self.journal = journal
        self.agents = agents  # every agent's grants, checked against each other at a start

    @property
    def platform(self) -> str:
        return self.runtime.platform

    async def bring_up(self, session: Session, agent: AgentSpec) -> AgentHello:
        """Make every host resource of ``session`` and wait for its agent's hello; on any
        failure undo what was made and raise."""
        sid = session.sid
        async with contextlib.AsyncExitStack() as undo:
            await self.control.open(sid)
            undo.push_async_callback(quietly, "closing control socket", self.control.close, sid)
            await self.sockets.open(sid)
            undo.push_async_callback(quietly, "closing sockets", self.sockets.close, sid)
            await self._start_box(session, agent, undo, pooled=False)
            hello = await self._hello(session, self.layout.start_timeout)
            undo.pop_all()
        return hello

    async def _start_box(
        self,
        session: Session,
        agent: AgentSpec,
        undo: contextlib.AsyncExitStack,
        *,
        pooled: bool,
    ) -> None:
        """netns, queue dirs and key file, mount frame, bundle, unit (each undone by ``undo``)."""
        sid = session.sid
        netns = await asyncio.to_thread(self.netns.create, session.netns)
        undo.push_async_callback(quietly_sync, "deleting netns", self.netns.delete, session.netns)
        if pooled:  # no key, no queue, no session socket: empty mount sources (sealed at claim)
            await self.control.open_claim(sid)
            undo.push_async_callback(quietly, "removing socket dir", self.control.close, sid)
            await asyncio.to_thread(self.data.prepare_pooled, sid, agent.uid, agent.gid)
            undo.push_async_callback(quietly_sync, "removing queues", self.data.destroy, sid)
        else:
            await asyncio.to_thread(self.data.prepare, sid, agent.uid, agent.gid)
            undo.push_async_callback(quietly_sync, "removing session key", self.data.release, sid)
        granted = await asyncio.to_thread(self._grant_mounts, sid, agent)
        undo.push_async_callback(
            quietly_sync, "removing mount frame", self.mounts.remove_frame,
            frame_dir(sid, self.layout.state_dir),
        )  # fmt: skip
        bundle = self.layout.bundles_dir / sid
        rootfs = await asyncio.to_thread(self._rootfs, agent)
        policy = self._policy(session, agent, netns, granted, rootfs, pooled=pooled)
        spec = build_spec(policy, granted, self.layout.state_dir)
        await asyncio.to_thread(self.bundles.write, bundle, spec, granted, self.layout.state_dir)
        undo.push_async_callback(quietly_sync, "removing bundle", self.bundles.remove, bundle)
        undo.push_async_callback(
            quietly_sync, "deleting runsc state", self.runtime.delete, session.container_id
        )
        # Undone in reverse: stopped, then reset: a unit that failed stays loaded (CollectMode
        # inactive, so its result can be read) and would hold the name and a "failed" record.
        undo.push_async_callback(quietly_sync, "resetting unit", self.units.reset_failed,
                                 session.unit)  # fmt: skip
        undo.push_async_callback(
            quietly_sync, "stopping unit", self.units.stop, session.unit,
            self.layout.stop_timeout,
        )  # fmt: skip
        argv, stdin = await asyncio.to_thread(
            self.data.unit_entry, sid, self.runtime.run_argv(bundle, session.container_id)
        )
        try:
            unit = self._unit_spec(session, agent, netns, granted, argv=argv, stdin=stdin,
                                   pooled=pooled)  # fmt: skip
            await _finished_even_if_cancelled(
                asyncio.to_thread(self.units.start_transient, unit, self.layout.start_timeout)
            )
        finally:
            if stdin is not None:  # systemd holds a duplicate of its own
                os.close(stdin)
        # The unit's main process joined the netns before its exec (NetworkNamespacePath=, and
        # the start job of a Type=exec unit ends only after the exec), so it holds the namespace
        # now: its name under /run/netns is no longer needed. Released, a running session keeps
        # no mount on the host, and the next unit start does not copy (then hide) one more
        # mount per running session into its own mount namespace (docs/development.md).
        await quietly_sync("releasing the netns name", self.netns.delete, session.netns)

    async def bring_up_pooled(self, session: Session, agent: AgentSpec) -> None:
        """Start a sandbox for a pool (services/pool.py): its netns, empty queue directories and
        key file, bundle and unit, but no key, no queue and no socket served but the one its
        agent waits on until a session claims it (``seal`` wakes it)."""
        async with contextlib.AsyncExitStack() as undo:
            await self._start_box(session, agent, undo, pooled=True)
            # Ready once its agent waits on claim.sock, not when runsc was started: a claim
            # made while the agent still booted cost 5 s (api/control.py, ``wait_claim``).
            await self._from_agent(session, self.control.wait_claim(session.sid),
                                   self.layout.start_timeout)  # fmt: skip
            undo.pop_all()

    async def seal(self, session: Session, agent: AgentSpec) -> AgentHello:
        """Bind a pooled sandbox to ``session``: its new key, its sockets served, and the
        agent's hello. On any failure the whole sandbox is torn down, never returned."""
        sid = session.sid
        try:
            await asyncio.to_thread(self.data.seal, sid, agent.uid, agent.gid)
            await self.control.open(sid)
            await self.sockets.open(sid)
            await self.control.wake(sid)
            return await self._hello(session, self.layout.start_timeout)
        except BaseException:
            await self.teardown(session)
            raise

    async def claimable(self, session: Session) -> bool:
        """Whether a pooled sandbox still runs, checked before its claim: its agent waiting on
        claim.sock says so at once; without that connection (not made yet, or the agent polls
        its key file) systemd is asked."""
        if self.control.claim_waiting(session.sid):
            return True
        found = await asyncio.to_thread(self.units.list_units, session.unit)
        return any(u.name == session.unit and u.active_state == "active" for u in found)

    async def reattach(self, session: Session) -> AgentHello:
        """Listen on the sockets of a sandbox an earlier daemon left running and wait for its
        agent to reconnect."""
        await self.control.open(session.sid)
        await self.sockets.open(session.sid)
        return await self._hello(session, self.layout.adopt_timeout)

    async def _hello(self, session: Session, within: float) -> AgentHello:
        """The agent's hello within ``within`` seconds (TimeoutError after)."""
        return await self._from_agent(session, self.control.wait_hello(session.sid), within)

    async def _from_agent(self, session: Session, wait: Awaitable[_T], within: float) -> _T:
        """What ``wait`` awaits of the sandbox's agent, within ``within`` seconds (TimeoutError
        after). The unit is checked meanwhile: one that ended first fails the wait at once with
        its result and the last line it wrote, instead of a timeout that names neither."""
        waiting = asyncio.ensure_future(wait)
        # The interval doubles up to UNIT_CHECK_MAX_FACTOR times the first: a failing runsc is
        # still seen within a second, and 500 sessions adopted together after a restart do not
        # flood the bus and the worker threads with 2,000 checks a second.
        interval = self.layout.unit_check_seconds
        try:
            async with asyncio.timeout(within):
                while True:
                    done, _ = await asyncio.wait((waiting,), timeout=interval)
                    if done:
                        return waiting.result()
                    interval = min(
                        interval * 2, self.layout.unit_check_seconds * UNIT_CHECK_MAX_FACTOR
                    )
                    ended = await asyncio.to_thread(self._ended, session.unit)
                    if ended is not None:
                        raise SandboxError(ended)
        finally:
            waiting.cancel()

    def _ended(self, unit: str) -> str | None:
        """Why ``unit`` can no longer say hello (None: it is still starting or running)."""
        state = next((u for u in self.units.list_units(unit) if u.name == unit), None)
        if state is not None and state.active_state not in ("inactive", "failed"):
            return None
        how = "is gone" if state is None else f"ended (result: {state.result})"
        reason = f"sandbox unit {unit} {how} before its agent connected"
        last = self._last_output(unit)
        return f"{reason}; its last output: {last!r}" if last else reason

    def _last_output(self, unit: str) -> str:
        """The unit's last line of its own (runsc's, not systemd's), clipped; "" if none."""
        if self.journal is None:
            return ""
        try:
            lines = self.journal.tail(unit, 10)
        except (IronclawError, OSError):
            return ""
        own = [line.message for line in lines if line.source != "systemd" and line.message]
        return own[-1][:LAST_OUTPUT_CHARS] if own else ""

    async def wait_exit(self, session: Session) -> str:
        """After the agent's connection dropped: the unit's result once it is inactive."""
        unit = await asyncio.to_thread(
            self.units.wait_inactive, session.unit, self.layout.stop_timeout
        )
        return unit.result if unit else "gone"

    async def teardown(self, session: Session) -> None:
        """Remove every host resource of a session; safe to repeat."""
        await quietly_sync("stopping unit", self.units.stop, session.unit, self.layout.stop_timeout)
        # Sandbox units use CollectMode=inactive: a failed one stays loaded so its result can be
        # read; it must be reset before the name is used again.
        await quietly_sync("resetting unit", self.units.reset_failed, session.unit)
        await quietly_sync("deleting runsc state", self.runtime.delete, session.container_id)
        await quietly_sync("deleting netns", self.netns.delete, session.netns)
        await quietly_sync(
            "removing bundle", self.bundles.remove, self.layout.bundles_dir / session.sid
        )
        await quietly("closing sockets", self.sockets.close, session.sid)
        await quietly("closing control socket", self.control.close, session.sid)
        await quietly_sync("removing session key", self.data.release, session.sid)
        await quietly_sync(
            "removing mount frame",
            self.mounts.remove_frame,
            frame_dir(session.sid, self.layout.state_dir),
        )

    def _grant_mounts(self, sid: str, agent: AgentSpec) -> tuple[Mount, ...]:
        """The agent's approved mounts, each source checked again against the allowlist (it may
        have been shrunk, or a path turned into a symlink, since approval); the frame made; and
        its installed skills written (once per distinct set) and bound read-only at /skills."""
        for grant in agent.mounts:
            self.mounts.resolve(grant.source, self.layout.mount_allowlist)
        if agent.mounts and self.agents is not None:
            # Approved apart, two agents' grants may nest (one approved before the other).
            why = grant_overlap(agent.name, agent.mounts, self.agents)
            if why is not None:
                raise PolicyDenied(f"agent '{agent.name}': {why}")
        skills: tuple[Mount, ...] = ()
        if agent.skills:  # before the frame: a refused set leaves nothing to undo
            root = skill_sets_dir(self.layout.state_dir)
            skills = (skills_mount(self.mounts.skill_set(agent.skills, root)),)
        if agent.mounts:
            frame = frame_dir(sid, self.layout.state_dir)
            self.mounts.make_frame(frame, [g.name for g in agent.mounts])
        return granted_mounts(sid, agent.mounts, self.layout.state_dir) + skills

    def _rootfs(self, agent: AgentSpec) -> Path:
        """The agent's image: the shared base, or the one holding its approved packages (built
        again if it is gone; each ``.deb`` re-checked against its approved hash)."""
        if not agent.packages:
            return self.layout.rootfs
        if self.images is None:
            raise SandboxError(f"agent '{agent.name}' has packages but no image builder is wired")
        return self.images.image(agent.packages)

    def _policy(
        self,
        session: Session,
        agent: AgentSpec,
        netns: Path,
        granted: tuple[Mount, ...] = (),
        rootfs: Path | None = None,
        *,
        pooled: bool = False,
    ) -> SandboxPolicy:
        # A pooled agent waits for its claim without a deadline (agent/main.py).
        wait = (("IRONCLAW_POOLED", "1"),) if pooled else ()
        return SandboxPolicy(
            sid=session.sid,
            agent=agent.name,
            uid=agent.uid,
            gid=agent.gid,
            host_uid=agent.uid,
            host_gid=agent.gid,
            rootfs=str(rootfs or self.layout.rootfs),
            netns=str(netns),
            argv=AGENT_ARGV,
            env=(("IRONCLAW_CONTROL_SOCKET", f"{SOCKETS_DIR}/control.sock"),
                 ("IRONCLAW_SID", session.sid), *wait),
            memory_bytes=agent.memory_bytes,
            tasks_max=agent.tasks_max,
            cpu_percent=agent.cpu_percent,
            workspace_bytes=agent.workspace_bytes,
            mounts=session_mounts(session.sid, self.layout.state_dir) + granted,
        )  # fmt: skip

    def _unit_spec(
        self,
        session: Session,
        agent: AgentSpec,
        netns: Path,
        granted: tuple[Mount, ...],
        *,
        argv: list[str],
        stdin: int | None,
        pooled: bool = False,
    ) -> UnitSpec:
        mounts = session_mounts(session.sid, self.layout.state_dir) + granted
        writable = [Path(m.source) for m in mounts if not m.read_only]
        return UnitSpec(
            name=session.unit,
            argv=argv,
            description=f"IronClaw sandbox {session.sid} (agent {agent.name}"
            f"{', pooled' if pooled else ''})",
            netns_path=netns,
            memory_max_bytes=agent.memory_bytes,
            tasks_max=agent.tasks_max,
            cpu_quota_percent=agent.cpu_percent,
            stop_timeout_seconds=self.layout.stop_timeout,
            collect_mode="inactive",
            writable_paths=(*self.runtime.writable_paths(), *writable),
            readonly_paths=tuple(Path(m.source) for m in granted if m.read_only),
            stdin_fd=stdin,
        )  # fmt: skip


async def _finished_even_if_cancelled(work: Awaitable[object]) -> None:
    """Await ``work``; if the caller is cancelled meanwhile (a stop while a sandbox starts),
    wait for it still, then raise the cancellation. A unit's start in a worker thread goes on
    when its awaiter is cancelled: the undo that follows must not stop the unit before systemd
    has it (the start would come after, with no record), nor the descriptor it is handed be
    closed, and its number reused, while the thread still sends it."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task
        raise


async def quietly(what: str, fn: Callable[..., Awaitable[object]], *args: object) -> None:
    """Await ``fn(*args)``; a failure is logged as a cleanup warning, never raised."""
    try:
        await fn(*args)
    except (IronclawError, OSError) as exc:
        log.warning("cleanup: %s: %s", what, exc)


async def quietly_sync(what: str, fn: Callable[..., object], *args: object) -> None:
    """Run ``fn(*args)`` in a thread; a failure is logged as a cleanup warning, never raised."""
    try:
        await asyncio.to_thread(fn, *args)
    except (IronclawError, OSError) as exc:
        log.warning("cleanup: %s: %s", what, exc)
