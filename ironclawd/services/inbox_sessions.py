"""``ChannelSessions``: which session a channel message goes to (services/inbox.py).

The session its route's key names (``domain/channels.py`` ``session_key``): the one recorded
for (channel, where, key) while it exists and belongs to the route's agent, else a new one,
recorded for the key. A new session is recorded before it is made, so that one whose start
fails is kept (FAILED) and the channel's next try of the message starts it again rather than
making another; only a create that lets the session service pick the id can take a sandbox of
the warm pool, so while the pool holds one of the agent's, the first create does that.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from ironclawd.domain.channels import Route, session_key
from ironclawd.domain.session import Session, new_sid
from ironclawd.errors import NotFound, SandboxError
from ironclawd.ports.channel_records import ChannelRecords
from ironclawd.ports.channels import InboundEvent

log = logging.getLogger("ironclawd.inbox")

# Sessions of one room (a per-room route: the room's, and one per thread) at most; the threads
# past it share the room's session.
MAX_ROOM_SESSIONS = 32
MAX_START_FAILED = 1024  # session keys remembered for a failed start of a pooled sandbox


class PoolView(Protocol):
    """What the inbox asks of the warm pool (services/pool.py ``WarmPool``)."""

    def status(self) -> list[tuple[str, int]]:
        """(agent, ready sandboxes) for each agent the pool holds or fills."""
        ...


class SessionPort(Protocol):
    """What the inbox needs of ``SessionService``."""

    @property
    def pool(self) -> PoolView | None: ...
    def get(self, sid: str) -> Session: ...
    async def create(self, agent: str, sid: str | None = None) -> Session: ...


class ChannelSessions:
    def __init__(self, records: ChannelRecords, sessions: SessionPort) -> None:
        self._records = records
        self._sessions = sessions
        self._key_locks: dict[tuple[str, str, str], asyncio.Lock] = {}
        # Session keys whose last create (of a pooled sandbox) failed to start: the next one
        # is recorded first.
        self._start_failed: set[tuple[str, str, str]] = set()

    async def session_for(self, event: InboundEvent, agent: str, route: Route) -> str:
        """The session ``event`` goes to on ``route`` (made if need be)."""
        key = session_key(route, f"{event.channel}:{event.sender}", event.where, event.thread)
        if (
            route.sessions == "per_room"
            and event.thread
            and self._threads_full(event.channel, event.where, key, agent)
        ):
            key = session_key(route, "", event.where, "")  # the room's own session
        return await self._session_for(event.channel, event.where, key, agent)

    async def _session_for(self, channel: str, where: str, key: str, agent: str) -> str:
        lock = self._key_locks.setdefault((channel, where, key), asyncio.Lock())
        async with lock:
            sid = self._records.channel_session(channel, where, key)
            if sid is not None and self._usable(sid, agent):
                return sid
            if self._pooled(agent) and (channel, where, key) not in self._start_failed:
                try:
                    session = await self._sessions.create(agent)
                except SandboxError:
                    if len(self._start_failed) >= MAX_START_FAILED:  # keys a sender can name
                        self._start_failed.clear()
                    self._start_failed.add((channel, where, key))
                    raise
            else:
                # Recorded first: one whose start fails is kept, FAILED, and the channel's next
                # try starts it again (its send does) rather than making one more failed
                # session each time (found by a review: one a minute while the cause lasted).
                sid = new_sid()
                self._records.set_channel_session(channel, where, key, sid)
                session = await self._sessions.create(agent, sid)
            self._start_failed.discard((channel, where, key))
            self._records.set_channel_session(channel, where, key, session.sid)
            log.info("channel %s: session %s of agent %s for %r", channel, session.sid, agent, key)
            return session.sid

    def _pooled(self, agent: str) -> bool:
        """Whether the warm pool holds a ready sandbox of ``agent``."""
        pool = self._sessions.pool
        return pool is not None and dict(pool.status()).get(agent, 0) > 0

    def _threads_full(self, channel: str, where: str, key: str, agent: str) -> bool:
        """Whether a new thread of (channel, where) must share the room's session: the room
        has ``MAX_ROOM_SESSIONS`` of the agent's already. A sender names threads at will, and
        each session is a sandbox (stop 47's review: one per message)."""
        sid = self._records.channel_session(channel, where, key)
        if sid is not None and self._usable(sid, agent):
            return False
        live = sum(self._usable(s, agent) for s in self._records.channel_sessions(channel, where))
        return live >= MAX_ROOM_SESSIONS

    def _usable(self, sid: str, agent: str) -> bool:
        try:
            return self._sessions.get(sid).agent == agent  # rewired: a session of the new agent
        except NotFound:
            return False
