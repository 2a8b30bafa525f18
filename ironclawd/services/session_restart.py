"""An agent's new spec reaching its sessions: an approved change's restart of the agent's
running sessions (``restart_agent_sessions``), the start of the sessions a cut restart left
stopped (``finish_restarts``), and a start that finds the spec replaced under it (``_respec``).

Each record a restart writes for a session until it runs again carries the restart's mark
(``Session.restarting``): a daemon stop or death that cuts the restart leaves the session
stopped and marked, and the next start (``reconcile``) starts it; the operator's stop clears
the mark. A part of ``SessionService`` (services/sessions.py), whose locks and owned tasks
these commands run under."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ironclawd.domain.agents import AgentSpec, find_agent
from ironclawd.domain.session import LIVE, Session, State
from ironclawd.errors import IronclawError, SandboxError
from ironclawd.ports import AgentHello
from ironclawd.services.session_lifecycle import SandboxLifecycle
from ironclawd.services.session_records import HeldRecords

log = logging.getLogger("ironclawd.sessions")

T = TypeVar("T")
# How many times one start may find its agent's spec replaced under it and start again.
MAX_RESPECS = 3


class AgentRestarts:
    """``SessionService``'s commands that bring an agent's new spec to its sessions."""

    _store: HeldRecords
    _agents: Mapping[str, AgentSpec]
    lifecycle: SandboxLifecycle
    # Creates in flight per agent, from the moment they read its spec (before their session
    # is stored): an applied change waits for them (``restart_agent_sessions``).
    _creating: dict[str, set[asyncio.Task[Any]]]
    # The spec each running sandbox was started with (never for an adopted one).
    _built: dict[str, AgentSpec]

    if TYPE_CHECKING:  # the session service's own (services/sessions.py)

        def list_sessions(self) -> list[Session]: ...
        def lock(self, sid: str) -> asyncio.Lock: ...
        async def stop_locked(
            self, session: Session, final: State, error: str = "", *, restarting: bool = False
        ) -> Session: ...
        async def _owned(self, work: Coroutine[Any, Any, T], creating: str = "") -> T: ...
        async def _guarded(self, sid: str, what: str, work: Coroutine[Any, Any, T]) -> T: ...
        async def _start(
            self, session: Session, agent: AgentSpec, pooled: bool = False, *,
            restarting: bool = False,
        ) -> Session: ...  # fmt: skip

    async def restart_agent_sessions(self, agent: str) -> list[str]:
        """Restart every running session of ``agent`` so it runs with the agent's new spec (the
        caller has put it). Starts under way read the old spec before it was put: each checks
        the spec again once its sandbox is up and starts over with the new one (``_respec``).
        They are waited for here, creates not yet stored among them, so that when this returns
        no session of the agent runs, or is about to run, what the old spec granted (a revoked
        mount). A session already running this very spec (started after it was put) is not
        restarted again; one a restart cut (``Session.restarting``) is started."""
        creating = set(self._creating.get(agent, ()))
        starting = [
            s.sid for s in self.list_sessions()
            if s.agent == agent and s.state in (State.CREATING, State.STARTING)
        ]  # fmt: skip
        if creating:
            await asyncio.wait(creating)
        for sid in starting:
            async with self.lock(sid):
                pass  # its start has ended, on the spec it found then
        current = self._agents.get(agent)
        restarted: list[str] = []
        for session in self.list_sessions():
            if session.agent != agent or not _restartable(session):
                continue
            if current is not None and self._built.get(session.sid) is current:
                continue  # started with this very spec, after it was put
            try:
                if await self._owned(self._restart_cmd(session.sid)):
                    restarted.append(session.sid)
            except IronclawError as exc:
                log.error("restarting session %s for a new agent spec: %s", session.sid, exc)
        return restarted

    async def finish_restarts(self) -> list[str]:
        """Start every session a cut restart left stopped and marked (``Session.restarting``)
        on its agent's spec: at the daemon's start, once ``reconcile`` has settled what the last
        run left. The resume of the change started one only while the change was approved: one
        whose restart could not record its end (a full disk) but whose change was recorded
        applied stayed down, and marked, until the agent's next change."""
        restarted: list[str] = []
        for session in self.list_sessions():
            if not _cut(session):
                continue
            try:
                if await self._owned(self._restart_cmd(session.sid, cut_only=True)):
                    restarted.append(session.sid)
            except IronclawError as exc:
                log.error("finishing the restart of session %s: %s", session.sid, exc)
        return restarted

    async def _restart_cmd(self, sid: str, cut_only: bool = False) -> bool:
        """Stop ``sid`` and start it on its agent's spec, under its lock throughout; False if it
        is no longer to restart (stopped or removed since; ``cut_only``: not stopped and marked
        any more). Stopped in one command and started in the next, a session stayed stopped
        when the daemon's stop refused or cancelled the start, or its death cut it, and the
        change's resume restarted only running sessions."""
        async with self.lock(sid):
            session = self._store.get(sid)
            if not (_cut(session) if cut_only else _restartable(session)):
                return False
            agent = find_agent(self._agents, session.agent)
            await self._guarded(sid, "restarting", self._restart(session, agent))
            return True

    async def _restart(self, session: Session, agent: AgentSpec) -> Session:
        try:
            if session.state is State.RUNNING:
                session = await self.stop_locked(session, State.STOPPED, restarting=True)
            return await self._start(session, agent, restarting=True)
        except asyncio.CancelledError:  # the daemon stops: its next start finishes the restart
            left = self._store.get(session.sid)
            if left.state in LIVE:
                await self.stop_locked(left, State.STOPPED, restarting=True)
            raise

    async def _respec(
        self, session: Session, agent: AgentSpec, hello: AgentHello
    ) -> tuple[AgentSpec, AgentHello]:
        """The spec ``session``'s sandbox runs with, and its hello: ``agent``'s, or the agent's
        current one if an approved change put a new spec while the sandbox started. That
        change's restart of the agent's running sessions could not reach this one (it was not
        running yet), and it waits for this start to end: the sandbox of the old spec (a mount
        the change revoked, a skill it removed) is torn down and a new one started."""
        for _ in range(MAX_RESPECS):
            current = find_agent(self._agents, session.agent)
            if current is agent:
                return agent, hello
            log.info("session %s: agent %s changed while the session started; starting it "
                     "again with the new spec", session.sid, session.agent)  # fmt: skip
            await self.lifecycle.teardown(session)
            agent = current
            hello = await self.lifecycle.bring_up(session, agent)
        raise SandboxError(f"agent {session.agent} changed {MAX_RESPECS} times while session "
                           f"{session.sid} started; start it again")  # fmt: skip


def _restartable(session: Session) -> bool:
    """Running, or left stopped by a restart that was cut."""
    return session.state is State.RUNNING or _cut(session)


def _cut(session: Session) -> bool:
    """Left stopped by a restart that was cut (``Session.restarting``)."""
    return session.state is State.STOPPED and session.restarting
