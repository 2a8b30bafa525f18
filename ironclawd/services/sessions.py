"""Session lifecycle: create, start, stop, remove, idle stop, and reconcile after a restart.

A session's host resources (socket dir, netns, bundle, runsc state, unit) are made inside one
AsyncExitStack and kept only if the agent says hello; any failure rolls all of them back. The
state is persisted after every transition (docs/style.md §8, §11).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from ironclawd import paths
from ironclawd.bundle.spec import (
    SOCKETS_DIR,
    build_spec,
    frame_dir,
    granted_mounts,
    session_mounts,
)
from ironclawd.bundle.writer import write_bundle
from ironclawd.domain.agents import AgentSpec, find_agent
from ironclawd.domain.policy import Mount, SandboxPolicy
from ironclawd.domain.session import LIVE, Session, State, check_sid, new_sid, transition
from ironclawd.errors import Conflict, IronclawError, SandboxError
from ironclawd.host.mounts import make_frame, remove_frame, resolve_mount_source
from ironclawd.ports import (
    AuditSink,
    ControlPlane,
    NetnsManager,
    SandboxRuntime,
    SandboxSockets,
    UnitManager,
    UnitSpec,
)
from ironclawd.services.session_data import SessionData
from ironclawd.store.state import StateStore

log = logging.getLogger("ironclawd.sessions")

T = TypeVar("T")
TOUCH_PERSIST_SECONDS = 10.0
AGENT_ARGV = ("/app/agent/agent",)


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


class SessionService:
    def __init__(
        self,
        *,
        store: StateStore,
        units: UnitManager,
        netns: NetnsManager,
        control: ControlPlane,
        runtime: SandboxRuntime,
        layout: SandboxLayout,
        data: SessionData,
        agents: Mapping[str, AgentSpec],
        sockets: SandboxSockets | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self.units = units
        self.netns = netns
        self.control = control
        self.runtime = runtime
        self.layout = layout
        self.data = data
        self.sockets = sockets
        self.audit: AuditSink | None = None
        self._remove_hooks: list[Callable[[str], None]] = []
        self._last_active: dict[str, float] = {}
        self._persisted_active: dict[str, float] = {}
        self._exit_hooks: list[Callable[[str], Awaitable[None]]] = []
        self._agents = agents
        self._clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        self._idle_timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._work: set[asyncio.Task[Any]] = set()  # commands in flight (``_owned``)

    # -- queries ---------------------------------------------------------------------------

    def list_sessions(self) -> list[Session]:
        return [self._with_activity(s) for s in self._store.list_sessions()]

    def get(self, sid: str) -> Session:
        return self._with_activity(self._store.get(check_sid(sid)))

    # -- commands --------------------------------------------------------------------------

    # Each command runs in a task the service owns (``_owned``): a caller that goes away (an
    # expired deadline, a closed connection) cancels only its wait, never the work, and every
    # way the work can end leaves the session settled (``_guarded``).

    async def create(self, agent: str, sid: str | None = None) -> Session:
        spec = find_agent(self._agents, agent)
        sid = check_sid(sid) if sid else new_sid()
        self.data.check_space(f"creating session {sid}")
        return await self._owned(self._create(spec, sid))

    async def _create(self, spec: AgentSpec, sid: str) -> Session:
        now = self._clock()
        session = Session(sid, spec.name, State.CREATING, now, now, now)
        async with self._lock(sid):
            self._store.insert(session)  # Conflict if the id is taken
            return await self._guarded(sid, "creating", self._created_then_start(session, spec))

    async def _created_then_start(self, session: Session, spec: AgentSpec) -> Session:
        self._audit(session, "created")
        return await self._start(session, spec)

    async def start(self, sid: str) -> Session:
        return await self._owned(self._start_cmd(check_sid(sid)))

    async def _start_cmd(self, sid: str) -> Session:
        async with self._lock(sid):
            session = self._store.get(sid)
            if session.state is State.RUNNING:
                return session
            if session.state not in (State.STOPPED, State.FAILED):
                raise Conflict(f"session {sid} is {session.state.value}: cannot start it now")
            if session.state is State.FAILED:
                await self._teardown(session)
            agent = find_agent(self._agents, session.agent)
            return await self._guarded(sid, "starting", self._start(session, agent))

    async def stop(self, sid: str) -> Session:
        return await self._owned(self._stop_cmd(check_sid(sid)))

    async def _stop_cmd(self, sid: str) -> Session:
        async with self._lock(sid):
            session = self._store.get(sid)
            if session.state is State.STOPPED:
                return session
            return await self._guarded(sid, "stopping", self._stop(session, State.STOPPED))

    async def remove(self, sid: str, force: bool = False) -> None:
        await self._owned(self._remove_cmd(check_sid(sid), force))

    async def _remove_cmd(self, sid: str, force: bool) -> None:
        async with self._lock(sid):
            session = self._store.get(sid)
            if session.state in LIVE and not force:
                raise Conflict(
                    f"session {sid} is {session.state.value}: stop it first (or use --force)"
                )
            if session.state is not State.STOPPED:
                session = await self._guarded(sid, "removing", self._stop(session, State.STOPPED))
            await self._teardown(session)  # idempotent: nothing of it may outlive its record
            for hook in self._remove_hooks:
                hook(sid)
            # The key goes first: from then on the queue files are unreadable, even copies.
            await asyncio.to_thread(self.data.destroy, sid)
            self._store.delete(sid)
            self._last_active.pop(sid, None)
            self._persisted_active.pop(sid, None)
            self._audit(session, "removed")
        self._locks.pop(sid, None)

    async def restart_agent_sessions(self, agent: str) -> list[str]:
        """Restart every running session of ``agent`` so it runs with the agent's new spec."""
        restarted: list[str] = []
        for session in self.list_sessions():
            if session.agent == agent and session.state is State.RUNNING:
                try:
                    await self.stop(session.sid)
                    await self.start(session.sid)
                    restarted.append(session.sid)
                except IronclawError as exc:
                    log.error("restarting session %s for a new agent spec: %s", session.sid, exc)
        return restarted

    async def _open_sockets(self, sid: str) -> None:
        if self.sockets is not None:
            await self.sockets.open(sid)

    async def _close_sockets(self, sid: str) -> None:
        if self.sockets is not None:
            await self.sockets.close(sid)

    def on_sandbox_exit(self, hook: Callable[[str], Awaitable[None]]) -> None:
        """Call ``hook(sid)`` after a running sandbox died on its own and the session was
        marked failed (not after a stop or remove asked for by the operator)."""
        self._exit_hooks.append(hook)

    def on_remove(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(sid)`` when a session is removed, before its data is destroyed."""
        self._remove_hooks.append(hook)

    async def adopt(self, session: Session) -> Session:
        """Take over a sandbox left running by an earlier daemon: listen on its control socket
        again and wait for the agent to reconnect; tear it down if it does not."""
        sid = session.sid
        async with self._lock(sid):
            try:
                await self.control.open(sid)
                await self._open_sockets(sid)
                async with asyncio.timeout(self.layout.adopt_timeout):
                    hello = await self.control.wait_hello(sid)
            except (IronclawError, OSError, TimeoutError) as exc:
                reason = _describe(exc, f"adopting session {sid}")
                log.warning("%s", reason)
                return await self._stop(session, State.FAILED, error=reason)
            log.info("session %s adopted: agent pid %d", sid, hello.pid)
            self._audit(session, "adopted")
            self._arm_idle(sid)
            self._watch(sid)
            return session

    async def settle(self, session: Session, reason: str) -> Session:
        """Clean up a session a dead daemon left mid-transition: a stop under way is finished
        (stopped), anything else ends failed with ``reason``."""
        async with self._lock(session.sid):
            if session.state is State.CREATING:
                session = self._move(session, State.FAILED, error=reason)
                await self._teardown(session)
                return session
            if session.state is State.STOPPING:
                return await self._stop(session, State.STOPPED)
            return await self._stop(session, State.FAILED, error=reason)

    async def mark_failed(self, sid: str, reason: str) -> Session:
        """The last resort for a session nothing else could settle: tear down what may exist and
        record it failed with ``reason``, whatever state it was in (errors are logged)."""
        session = self._store.get(sid)
        await self._teardown(session)
        failed = replace(session, state=State.FAILED, updated_at=self._clock(), error=reason)
        self._store.save(failed)
        self._audit_quietly(failed, State.FAILED.value)
        return failed

    async def _owned(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` in a task of the service's and wait for it; cancelling the wait (the
        client left) does not cancel the task."""
        task = asyncio.get_running_loop().create_task(work)
        self._work.add(task)
        task.add_done_callback(_owned_done)
        task.add_done_callback(self._work.discard)
        return await asyncio.shield(task)

    async def _guarded(self, sid: str, what: str, work: Coroutine[Any, Any, T]) -> T:
        """Await ``work`` (a transition of session ``sid``, under its lock); if it ends any other
        way than by settling the session, tear it down and record it failed, then re-raise."""
        try:
            return await work
        except BaseException as exc:
            with contextlib.suppress(IronclawError):  # a session removed meanwhile is settled
                session = self._store.get(sid)
                if session.state in LIVE:
                    reason = _describe(exc, f"{what} session {sid}")
                    log.error("%s", reason)
                    await self._teardown(session)
                    failed = transition(session, State.FAILED, self._clock(), reason)
                    self._store.save(failed)
                    self._audit_quietly(failed, State.FAILED.value)
            raise

    def touch(self, sid: str) -> None:
        """Record activity (a message) so the idle timer starts over. Kept in memory and written
        to the state DB at most every TOUCH_PERSIST_SECONDS: every send and every ingested reply
        touches, and each write is an fsync on the message path."""
        now = self._clock()
        self._last_active[sid] = now
        if now - self._persisted_active.get(sid, 0.0) >= TOUCH_PERSIST_SECONDS:
            self._store.save(replace(self._store.get(sid), last_active_at=now))
            self._persisted_active[sid] = now
        self._arm_idle(sid)

    def _with_activity(self, session: Session) -> Session:
        recent = self._last_active.get(session.sid, 0.0)
        if recent > session.last_active_at:
            return replace(session, last_active_at=recent)
        return session

    # -- lifecycle internals ---------------------------------------------------------------

    async def _start(self, session: Session, agent: AgentSpec) -> Session:
        session = self._move(session, State.STARTING)
        sid = session.sid
        try:
            async with contextlib.AsyncExitStack() as undo:
                await self.control.open(sid)
                undo.push_async_callback(
                    self._quietly, "closing control socket", self.control.close, sid
                )
                await self._open_sockets(sid)
                undo.push_async_callback(self._quietly, "closing sockets", self._close_sockets, sid)
                netns = await asyncio.to_thread(self.netns.create, session.netns)
                undo.push_async_callback(
                    self._quietly_sync, "deleting netns", self.netns.delete, session.netns
                )
                await asyncio.to_thread(self.data.prepare, sid, agent.uid, agent.gid)
                undo.push_async_callback(
                    self._quietly_sync, "removing session key", self.data.release, sid
                )
                granted = await asyncio.to_thread(self._grant_mounts, sid, agent)
                undo.push_async_callback(
                    self._quietly_sync, "removing mount frame", remove_frame,
                    frame_dir(sid, self.layout.state_dir),
                )  # fmt: skip
                bundle = self.layout.bundles_dir / sid
                policy = self._policy(session, agent, netns, granted)
                spec = build_spec(policy, granted, self.layout.state_dir)
                await asyncio.to_thread(write_bundle, bundle, spec, granted, self.layout.state_dir)
                undo.push_async_callback(self._quietly_sync, "removing bundle", remove_tree, bundle)
                undo.push_async_callback(
                    self._quietly_sync,
                    "deleting runsc state",
                    self.runtime.delete,
                    session.container_id,
                )
                unit = self._unit_spec(session, agent, bundle, netns, granted)
                undo.push_async_callback(
                    self._quietly_sync,
                    "stopping unit",
                    self.units.stop,
                    session.unit,
                    self.layout.stop_timeout,
                )
                await asyncio.to_thread(self.units.start_transient, unit, self.layout.start_timeout)
                async with asyncio.timeout(self.layout.start_timeout):
                    hello = await self.control.wait_hello(sid)
                undo.pop_all()
        except (IronclawError, OSError, TimeoutError) as exc:
            reason = _describe(exc, f"starting session {sid}")
            session = self._move(session, State.FAILED, error=reason)
            log.error("%s", reason)
            raise SandboxError(reason) from exc
        session = self._move(session, State.RUNNING, platform=self.runtime.platform)
        log.info("session %s running: agent pid %d uid %d", sid, hello.pid, hello.uid)
        self._arm_idle(sid)
        self._watch(sid)
        return session

    async def _stop(self, session: Session, final: State, error: str = "") -> Session:
        self._disarm_idle(session.sid)
        if session.state is not State.STOPPING:  # a stop a crash interrupted goes on
            session = self._move(session, State.STOPPING)
        await self._teardown(session)
        return self._move(session, final, error=error)

    async def _teardown(self, session: Session) -> None:
        """Remove every host resource of a session; safe to repeat."""
        await self._quietly_sync(
            "stopping unit", self.units.stop, session.unit, self.layout.stop_timeout
        )
        # Sandbox units use CollectMode=inactive: a failed one stays loaded so its result can be
        # read; it must be reset before the name is used again.
        await self._quietly_sync("resetting unit", self.units.reset_failed, session.unit)
        await self._quietly_sync("deleting runsc state", self.runtime.delete, session.container_id)
        await self._quietly_sync("deleting netns", self.netns.delete, session.netns)
        await self._quietly_sync(
            "removing bundle", remove_tree, self.layout.bundles_dir / session.sid
        )
        await self._quietly("closing sockets", self._close_sockets, session.sid)
        await self._quietly("closing control socket", self.control.close, session.sid)
        await self._quietly_sync("removing session key", self.data.release, session.sid)
        await self._quietly_sync(
            "removing mount frame", remove_frame, frame_dir(session.sid, self.layout.state_dir)
        )

    def _grant_mounts(self, sid: str, agent: AgentSpec) -> tuple[Mount, ...]:
        """The agent's approved mounts, each source checked again against the allowlist (it may
        have been shrunk, or a path turned into a symlink, since approval); the frame made."""
        for grant in agent.mounts:
            resolve_mount_source(grant.source, self.layout.mount_allowlist)
        if agent.mounts:
            make_frame(frame_dir(sid, self.layout.state_dir), [g.name for g in agent.mounts])
        return granted_mounts(sid, agent.mounts, self.layout.state_dir)

    def _policy(
        self, session: Session, agent: AgentSpec, netns: Path, granted: tuple[Mount, ...] = ()
    ) -> SandboxPolicy:
        return SandboxPolicy(
            sid=session.sid,
            agent=agent.name,
            uid=agent.uid,
            gid=agent.gid,
            host_uid=agent.uid,
            host_gid=agent.gid,
            rootfs=str(self.layout.rootfs),
            netns=str(netns),
            argv=AGENT_ARGV,
            env=(("IRONCLAW_CONTROL_SOCKET", f"{SOCKETS_DIR}/control.sock"),
                 ("IRONCLAW_SID", session.sid)),
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
        bundle: Path,
        netns: Path,
        granted: tuple[Mount, ...],
    ) -> UnitSpec:
        mounts = session_mounts(session.sid, self.layout.state_dir) + granted
        writable = [Path(m.source) for m in mounts if not m.read_only]
        return UnitSpec(
            name=session.unit,
            argv=self.runtime.run_argv(bundle, session.container_id),
            description=f"IronClaw sandbox {session.sid} (agent {agent.name})",
            netns_path=netns,
            memory_max_bytes=agent.memory_bytes,
            tasks_max=agent.tasks_max,
            cpu_quota_percent=agent.cpu_percent,
            stop_timeout_seconds=self.layout.stop_timeout,
            collect_mode="inactive",
            writable_paths=(*self.runtime.writable_paths(), *writable),
        )  # fmt: skip

    def _move(self, session: Session, to: State, *, error: str = "", platform: str = "") -> Session:
        moved = transition(session, to, self._clock(), error)
        if platform:
            moved = replace(moved, platform=platform)
        self._store.save(moved)
        self._audit(moved, to.value)
        return moved

    def _audit(self, session: Session, event: str) -> None:
        if self.audit is not None:
            self.audit.record(
                f"session.{event}", "ironclawd", sid=session.sid, agent=session.agent,
                error=session.error[:500],
            )  # fmt: skip
        log.info(
            "session %s %s%s",
            session.sid,
            event,
            f": {session.error}" if session.error else "",
            extra={"IRONCLAW_SID": session.sid, "IRONCLAW_SESSION_EVENT": event},
        )

    def _audit_quietly(self, session: Session, event: str) -> None:
        try:
            self._audit(session, event)
        except (IronclawError, OSError) as exc:
            log.error("session %s %s: not recorded in the audit log: %s", session.sid, event, exc)

    def _lock(self, sid: str) -> asyncio.Lock:
        return self._locks.setdefault(sid, asyncio.Lock())

    async def _quietly(
        self, what: str, fn: Callable[..., Awaitable[object]], *args: object
    ) -> None:
        try:
            await fn(*args)
        except (IronclawError, OSError) as exc:
            log.warning("cleanup: %s: %s", what, exc)

    async def _quietly_sync(self, what: str, fn: Callable[..., object], *args: object) -> None:
        try:
            await asyncio.to_thread(fn, *args)
        except (IronclawError, OSError) as exc:
            log.warning("cleanup: %s: %s", what, exc)

    # -- watching a running sandbox --------------------------------------------------------

    def _watch(self, sid: str) -> None:
        """When the agent's control connection drops, learn why from the unit (no polling)."""
        task = asyncio.get_running_loop().create_task(self._watch_one(sid))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_one(self, sid: str) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self.control.wait_disconnect(sid)
            async with self._lock(sid):
                with contextlib.suppress(IronclawError):
                    session = self._store.get(sid)
                    if session.state is not State.RUNNING:
                        return
                    unit = await asyncio.to_thread(
                        self.units.wait_inactive, session.unit, self.layout.stop_timeout
                    )
                    result = unit.result if unit else "gone"
                    reason = f"sandbox exited (unit result: {result})"
                    log.warning("session %s: %s", sid, reason)
                    await self._guarded(
                        sid, "failing", self._stop(session, State.FAILED, error=reason)
                    )
            # Outside the lock: a hook may start the session again.
            for hook in self._exit_hooks:
                await self._quietly(f"after session {sid} exited", hook, sid)

    def _arm_idle(self, sid: str) -> None:
        self._disarm_idle(sid)
        if self.layout.idle_timeout <= 0:
            return
        loop = asyncio.get_running_loop()
        self._idle_timers[sid] = loop.call_later(self.layout.idle_timeout, self._on_idle, sid)

    def _disarm_idle(self, sid: str) -> None:
        timer = self._idle_timers.pop(sid, None)
        if timer is not None:
            timer.cancel()

    def _on_idle(self, sid: str) -> None:
        self._idle_timers.pop(sid, None)

        async def stop_idle() -> None:
            with contextlib.suppress(IronclawError):
                session = self._with_activity(self._store.get(sid))
                idle_for = self._clock() - session.last_active_at
                if session.state is State.RUNNING and idle_for >= self.layout.idle_timeout:
                    log.info("session %s idle for %.0fs: stopping", sid, idle_for)
                    await self.stop(sid)

        task = asyncio.get_running_loop().create_task(stop_idle())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def store_close(self) -> None:
        self._store.close()

    async def close(self) -> None:
        """Let commands in flight finish (those still running after a stop timeout are cancelled
        and end failed), then stop watching (the sandboxes keep running: a restarted daemon
        adopts them)."""
        for sid in list(self._idle_timers):
            self._disarm_idle(sid)
        if self._work:
            await asyncio.wait(set(self._work), timeout=self.layout.stop_timeout)
        for task in [*self._work, *self._tasks]:
            task.cancel()
        await asyncio.gather(*self._work, *self._tasks, return_exceptions=True)


def remove_tree(path: Path) -> None:
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _owned_done(task: asyncio.Task[Any]) -> None:
    # Its caller may be gone: fetch the outcome so asyncio does not log it as never retrieved
    # (the work has logged and recorded it already).
    if not task.cancelled():
        task.exception()


def _describe(exc: BaseException, what: str) -> str:
    if isinstance(exc, TimeoutError):
        return f"{what}: the agent did not connect to its control socket in time"
    if isinstance(exc, asyncio.CancelledError):
        return f"{what}: cancelled (the daemon is stopping)"
    return f"{what}: {exc}"
