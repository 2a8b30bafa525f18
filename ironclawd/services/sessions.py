"""Session commands and queries: create, start, stop, remove, touch. Each transition is
persisted (docs/style.md §8, §11); host resources are ``SandboxLifecycle``'s, watching a running
sandbox is ``SessionWatcher``'s, bringing an agent's new spec to its sessions (an approved
change's restart) is ``AgentRestarts``' (session_restart.py), and settling what a dead daemon
left is ``reconcile``'s."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Coroutine, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from ironclawd.domain.agents import AgentSpec, find_agent
from ironclawd.domain.message_ids import SESSION_EVENTS, MessageId, message_id
from ironclawd.domain.session import LIVE, Session, State, check_sid, new_sid, transition
from ironclawd.errors import Conflict, HostError, IronclawError, NotFound, SandboxError
from ironclawd.ports import AuditSink, Clock, SessionRecords
from ironclawd.services.session_hooks import SessionHooks
from ironclawd.services.session_lifecycle import (
    SandboxLayout,
    SandboxLifecycle,
    quietly,
    quietly_sync,
)
from ironclawd.services.session_lock import SessionLock
from ironclawd.services.session_records import HeldRecords
from ironclawd.services.session_restart import AgentRestarts
from ironclawd.services.session_watch import OwnedTasks, SessionWatcher

if TYPE_CHECKING:
    from ironclawd.services.pool import WarmPool

__all__ = ["SandboxLayout", "SessionService"]

log = logging.getLogger("ironclawd.sessions")

T = TypeVar("T")
TOUCH_PERSIST_SECONDS = 10.0


class SessionService(AgentRestarts):
    def __init__(
        self,
        *,
        store: SessionRecords,
        lifecycle: SandboxLifecycle,
        agents: Mapping[str, AgentSpec],
        hooks: SessionHooks,
        audit: AuditSink,
        clock: Clock,
        pool: WarmPool | None = None,
    ) -> None:
        self._store = HeldRecords(store)  # with the failures the disk did not take
        self.pool = pool  # pre-started sandboxes a create without a sid claims
        self.lifecycle = lifecycle
        self.layout = lifecycle.layout
        self.data = lifecycle.data
        self._hooks = hooks
        self._audit = audit
        self._last_active: dict[str, float] = {}
        self._persisted_active: dict[str, float] = {}
        self._agents = agents
        self._clock = clock
        self._locks: dict[str, SessionLock] = {}  # only while someone holds or awaits one
        self._watcher = SessionWatcher(
            lifecycle.control, self.layout.idle_timeout, self._sandbox_exited, self._idle
        )
        self._work = OwnedTasks()  # commands in flight (``_owned``)
        self._closing = False  # ``close`` began: no command starts any more
        self._creating: dict[str, set[asyncio.Task[Any]]] = {}  # (session_restart.py)
        self._built: dict[str, AgentSpec] = {}
        # Which sandbox of a session is watched (``watch``): an exit watch acts only on its own.
        self._runs: dict[str, int] = {}
        self._run_numbers = itertools.count(1)

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
        given = check_sid(sid) if sid else None
        if given is not None and self.pool is not None and self.pool.holds(given):
            raise Conflict(f"session id {given} is taken")
        sid = given or new_sid()
        self.data.check_space(f"creating session {sid}")
        # Only a create that lets the daemon pick the id can take a pooled sandbox: it was
        # started under the id it now gets. Nothing between the claim and the insert awaits
        # but the task's start, and the id stays held until it is stored.
        pooled = self.pool.claim(spec) if self.pool is not None and given is None else None
        work = self._create(spec, pooled.sid if pooled else sid, pooled)
        return await self._owned(work, creating=spec.name)

    async def _create(self, spec: AgentSpec, sid: str, pooled: Session | None = None) -> Session:
        now = self._clock.time()
        session = Session(sid, spec.name, State.CREATING, now, now, now)
        running = False
        try:
            async with self.lock(sid):
                try:
                    self._store.insert(session)  # Conflict if the id is taken
                except BaseException as exc:
                    if pooled is not None:  # never returned to the pool
                        await self._discard_pooled(pooled, isinstance(exc, Conflict))
                    raise
                session = await self._guarded(
                    sid, "creating", self._created_then_start(session, spec, pooled is not None)
                )
                running = session.state is State.RUNNING
                return session
        finally:
            if pooled is not None and self.pool is not None:
                self.pool.done(sid, running=running)

    async def _discard_pooled(self, pooled: Session, taken: bool) -> None:
        log.error("session %s: could not be stored; destroying its pooled sandbox", pooled.sid)
        await self.lifecycle.teardown(pooled)
        if not taken:  # a record of that id (never expected) keeps its own data
            await quietly_sync("removing queues", self.data.destroy, pooled.sid)

    async def _created_then_start(
        self, session: Session, spec: AgentSpec, pooled: bool = False
    ) -> Session:
        self.audit_event(session, "created")
        return await self._start(session, spec, pooled)

    async def start(self, sid: str) -> Session:
        return await self._owned(self._start_cmd(check_sid(sid)))

    async def _start_cmd(self, sid: str) -> Session:
        async with self.lock(sid):
            session = self._store.get(sid)
            if session.state is State.RUNNING:
                return session
            if session.state not in (State.STOPPED, State.FAILED):
                raise Conflict(f"session {sid} is {session.state.value}: cannot start it now")
            if session.state is State.FAILED:
                await self.lifecycle.teardown(session)
            agent = find_agent(self._agents, session.agent)
            return await self._guarded(sid, "starting", self._start(session, agent))

    async def stop(self, sid: str) -> Session:
        return await self._owned(self._stop_cmd(check_sid(sid)))

    async def _stop_cmd(self, sid: str, idle: bool = False) -> Session:
        """``idle``: stop only if the session runs and has been idle ``idle_timeout`` seconds,
        judged once its lock is held (activity while the stop waited for it counts)."""
        async with self.lock(sid):
            session = self._store.get(sid)
            if session.state is State.STOPPED:
                if session.restarting and not idle:  # stopped on purpose: stays so
                    session = replace(session, restarting=False, updated_at=self._clock.time())
                    self._store.save(session)
                    self.audit_event(session, "stopped")
                return session
            if idle:
                idle_for = self._clock.time() - self._with_activity(session).last_active_at
                if session.state is not State.RUNNING:
                    return session
                if idle_for < self.layout.idle_timeout:
                    self._watcher.arm_idle(sid)  # from now: the clock may have stepped back
                    return session
                log.info("session %s idle for %.0fs: stopping", sid, idle_for)
            return await self._guarded(sid, "stopping", self.stop_locked(session, State.STOPPED))

    async def remove(self, sid: str, force: bool = False, only_if_unused: bool = False) -> None:
        """``only_if_unused``: Conflict if a message was ever queued to the session; judged
        with sends held back, which stay so until it is gone (``SessionHooks.fence_unused``)."""
        await self._owned(self._remove_cmd(check_sid(sid), force, only_if_unused))

    async def _remove_cmd(self, sid: str, force: bool, only_if_unused: bool = False) -> None:
        async with self.lock(sid):
            session = self._store.get(sid)
            if session.state in LIVE and not force:
                raise Conflict(
                    f"session {sid} is {session.state.value}: stop it first (or use --force)"
                )
            if only_if_unused and not await self._hooks.fence_unused(sid):
                raise Conflict(f"session {sid} has had messages queued to it: not removed")
            try:
                await self._remove_locked(session)
            finally:
                if only_if_unused:
                    self._hooks.lift(sid)

    async def _remove_locked(self, session: Session) -> None:
        sid = session.sid
        if session.state is not State.STOPPED:
            session = await self._guarded(sid, "removing", self.stop_locked(session, State.STOPPED))
        await self.lifecycle.teardown(session)  # idempotent: nothing may outlive its record
        await self._hooks.removed(sid)
        # The key goes first: from then on the queue files are unreadable, even copies.
        await asyncio.to_thread(self.data.destroy, sid)
        self._store.delete(sid)
        self._last_active.pop(sid, None)
        self._persisted_active.pop(sid, None)
        self._runs.pop(sid, None)
        self._hooks.gone(sid)
        self.audit_event(session, "removed")

    def answered(self, sid: str) -> None:
        """A reply of ``sid`` was taken in (the pool waits for a claim's first one)."""
        if self.pool is not None:
            self.pool.answered(sid)

    def touch(self, sid: str) -> None:
        """Record activity (a message) so the idle timer starts over. Kept in memory and written
        to the state DB at most every TOUCH_PERSIST_SECONDS: every send and every ingested reply
        touches, and each write is an fsync on the message path. A session removed meanwhile
        (a reply ingested as it went) is left alone: nothing is kept for an id it no longer
        names (the state DB caches the records it holds: a live one's check reads nothing)."""
        try:
            session = self._store.get(sid)
        except NotFound:
            return
        now = self._clock.time()
        self._last_active[sid] = now
        if now - self._persisted_active.get(sid, 0.0) >= TOUCH_PERSIST_SECONDS:
            self._store.save(replace(session, last_active_at=now))
            self._persisted_active[sid] = now
        self._watcher.arm_idle(sid)

    def _with_activity(self, session: Session) -> Session:
        recent = self._last_active.get(session.sid, 0.0)
        if recent > session.last_active_at:
            return replace(session, last_active_at=recent)
        return session

    # -- transitions (also used by ``reconcile``, always under the session's lock) ------------

    def lock(self, sid: str) -> asyncio.Lock:
        """``sid``'s lock: one for as long as anyone holds or waits for it (``SessionLock``)."""
        lock = self._locks.get(sid)
        if lock is None:
            lock = self._locks[sid] = SessionLock(self._locks, sid)
        return lock

    def stored(self, sid: str) -> Session:
        """The persisted record, without the in-memory activity."""
        return self._store.get(sid)

    def watch(self, sid: str) -> None:
        """A sandbox runs for ``sid``: start its idle timer and watch for its exit."""
        self._runs[sid] = next(self._run_numbers)
        self._watcher.arm_idle(sid)
        self._watcher.watch(sid)

    async def stop_locked(
        self, session: Session, final: State, error: str = "", *, restarting: bool = False
    ) -> Session:
        """Stop ``session`` and record it ``final`` with ``error``; ``restarting``: an approved
        change's restart stops it, and each record this writes carries the restart's mark."""
        self._watcher.disarm_idle(session.sid)
        self._built.pop(session.sid, None)
        if session.state is State.CREATING:
            # Left by a create that could not record its failure (a full disk). CREATING may not
            # become STOPPING: that first stop failed with Conflict, and only a second one worked.
            # A crash during the teardown leaves it CREATING, which reconcile fails and tears down.
            await self.lifecycle.teardown(session)
            return self.move(session, final, error=error, restarting=restarting)
        if session.state is not State.STOPPING:  # a stop a crash interrupted goes on
            # A restart's mark is there from the first record on (reconcile keeps it).
            session = self.move(session, State.STOPPING, restarting=restarting)
        await self.lifecycle.teardown(session)
        return self.move(session, final, error=error, restarting=restarting)

    def move(
        self,
        session: Session,
        to: State,
        *,
        error: str = "",
        platform: str = "",
        restarting: bool = False,
    ) -> Session:
        moved = transition(session, to, self._clock.time(), error, restarting=restarting)
        if platform:
            moved = replace(moved, platform=platform)
        self._store.save(moved)
        self.audit_event(moved, to.value)
        return moved

    def force_failed(self, session: Session, reason: str) -> Session:
        """Record ``session`` (torn down) failed whatever state it is in (no transition
        check); held in memory if the disk takes no record."""
        failed = replace(
            session, state=State.FAILED, updated_at=self._clock.time(), error=reason,
            restarting=False,
        )  # fmt: skip
        self._store.hold(failed)
        self.audit_quietly(failed, State.FAILED.value)
        return failed

    def audit_event(self, session: Session, event: str) -> None:
        self._audit.record(
            f"session.{event}", "ironclawd", sid=session.sid, agent=session.agent,
            error=session.error[:500],
        )  # fmt: skip
        log.info(
            "session %s %s%s",
            session.sid,
            event,
            f": {session.error}" if session.error else "",
            extra=_session_fields(session.sid, event),
        )

    def audit_quietly(self, session: Session, event: str) -> None:
        """``audit_event``, a failure to write logged instead of raised: for events whose work
        is already done (a sandbox reattached, a session failed) and must not be undone by it."""
        try:
            self.audit_event(session, event)
        except (IronclawError, OSError) as exc:
            log.error("session %s %s: not recorded in the audit log: %s", session.sid, event, exc)

    # -- internals -------------------------------------------------------------------------

    async def _owned(self, work: Coroutine[Any, Any, T], creating: str = "") -> T:
        """Run ``work`` in a task of the service's and wait for it; cancelling the wait (the
        client left) does not cancel the task. ``creating``: the agent whose new session it
        creates (``restart_agent_sessions`` waits for it). Once ``close`` began, ``work`` is
        cancelled at once, as the commands in flight then are: one started after it would run
        in a task nobody ends (an approved change's restart, going on in the gateway's task,
        tore down sandboxes the next start would adopt, and started others as the daemon
        closed its sockets and its state DB)."""
        if self._closing:
            work.close()
            raise asyncio.CancelledError
        task = self._work.spawn(work)
        task.add_done_callback(_owned_done)
        if creating:
            tasks = self._creating.setdefault(creating, set())
            tasks.add(task)
            task.add_done_callback(lambda done: self._created(creating, done))
        return await asyncio.shield(task)

    def _created(self, agent: str, task: asyncio.Task[Any]) -> None:
        tasks = self._creating.get(agent, set())
        tasks.discard(task)
        if not tasks:
            self._creating.pop(agent, None)

    async def _guarded(self, sid: str, what: str, work: Coroutine[Any, Any, T]) -> T:
        """Await ``work`` (a transition of session ``sid``, under its lock); if it ends any other
        way than by settling the session, tear it down and record it failed, then re-raise."""
        try:
            return await work
        except BaseException as exc:
            with contextlib.suppress(IronclawError):  # a session removed meanwhile is settled
                session = self._store.get(sid)
                if session.state in LIVE:
                    reason = describe(exc, f"{what} session {sid}")
                    log.error("%s", reason)
                    await self.lifecycle.teardown(session)
                    failed = transition(session, State.FAILED, self._clock.time(), reason)
                    self._store.hold(failed)  # a disk that takes no record leaves it held
                    self.audit_quietly(failed, State.FAILED.value)
            raise

    async def _start(
        self, session: Session, agent: AgentSpec, pooled: bool = False, *, restarting: bool = False
    ) -> Session:
        session = self.move(session, State.STARTING, restarting=restarting)
        sid = session.sid
        try:
            if pooled and not await self.lifecycle.claimable(session):
                log.warning("session %s: its pooled sandbox is gone; starting a new one", sid)
                await self.lifecycle.teardown(session)
                pooled = False
            if pooled:  # sealed to this session, or torn down: never returned
                hello = await self.lifecycle.seal(session, agent)
            else:
                hello = await self.lifecycle.bring_up(session, agent)
            agent, hello = await self._respec(session, agent, hello)
        except (IronclawError, OSError, TimeoutError) as exc:
            reason = describe(exc, f"starting session {sid}")
            log.error("%s", reason)  # first: a full disk may refuse the record of it
            session = self.move(session, State.FAILED, error=reason)
            raise SandboxError(reason) from exc
        self._built[sid] = agent
        session = self.move(session, State.RUNNING, platform=self.lifecycle.platform)
        log.info("session %s running: agent pid %d uid %d", sid, hello.pid, hello.uid)
        if pooled:
            log.info("session %s running in a pooled sandbox", sid)
        self.watch(sid)
        return session

    async def _sandbox_exited(self, sid: str) -> None:
        """The agent's control connection dropped: learn why from the unit. Only a sandbox that
        died on its own runs the exit hooks: a stop or a removal drops the connection too, and a
        removed session has no record left to say so. Nor does one whose sandbox was replaced
        while this waited for the lock (a start queued behind the stop that ended it)."""
        run = self._runs.get(sid)  # the sandbox whose connection dropped, now
        async with self.lock(sid):
            with contextlib.suppress(IronclawError):
                try:
                    session = self._store.get(sid)
                except NotFound:
                    return  # removed meanwhile: its removal ended the sandbox
                if session.state is not State.RUNNING or self._runs.get(sid) != run:
                    return
                try:
                    result = await self.lifecycle.wait_exit(session)
                except HostError as exc:
                    if self.lifecycle.control.connected(sid):
                        # Back (the daemon drops an agent that stops reading its lines, and it
                        # reconnects): the sandbox lives, and is watched again.
                        log.info("session %s: its agent connected again; watching it", sid)
                        self._watcher.watch(sid)
                        return
                    # The agent closed its control connection and its sandbox runs on: nothing
                    # reaches it any more, and nothing would see it die. It is stopped, failed.
                    reason = (
                        "the agent closed its control connection and its sandbox kept running "
                        f"({exc}); stopped"
                    )
                    extra: dict[str, object] = {}
                else:
                    reason = f"sandbox exited (unit result: {result})"
                    # A unit the kernel's OOM killer ended has Result "oom-kill"
                    # (org.freedesktop.systemd1(5)); its fix (memory_bytes) differs from others'.
                    oom = message_id(MessageId.SESSION_OOM, IRONCLAW_SID=sid)
                    extra = oom if result == "oom-kill" else {}
                log.warning("session %s: %s", sid, reason, extra=extra)
                await self._guarded(
                    sid, "failing", self.stop_locked(session, State.FAILED, error=reason)
                )
        # Outside the lock: a hook may start the session again.
        for hook in self._hooks.exit_hooks:
            await quietly(f"after session {sid} exited", hook, sid)

    async def _idle(self, sid: str) -> None:
        with contextlib.suppress(IronclawError):
            await self._owned(self._stop_cmd(sid, idle=True))

    async def close(self) -> None:
        """Let commands in flight finish (those still running after a stop timeout are cancelled
        and end failed), then stop watching (the sandboxes keep running: a restarted daemon
        adopts them)."""
        self._closing = True
        self._watcher.disarm_all()
        await self._work.settle(self.layout.stop_timeout)
        await asyncio.gather(self._work.close(), self._watcher.close())


def _owned_done(task: asyncio.Task[Any]) -> None:
    # Its caller may be gone: fetch the outcome so asyncio does not log it as never retrieved
    # (the work has logged and recorded it already).
    if not task.cancelled():
        task.exception()


def describe(exc: BaseException, what: str) -> str:
    if isinstance(exc, TimeoutError):
        return f"{what}: the agent did not connect to its control socket in time"
    if isinstance(exc, asyncio.CancelledError):
        return f"{what}: cancelled (the daemon is stopping)"
    return f"{what}: {exc}"


def _session_fields(sid: str, event: str) -> dict[str, object]:
    fields: dict[str, object] = {"IRONCLAW_SID": sid, "IRONCLAW_SESSION_EVENT": event}
    tagged = SESSION_EVENTS.get(event)
    return message_id(tagged, **fields) if tagged is not None else fields
