"""The session records ``SessionService`` acts on: the state DB's, and the failures it could
not write there (a full disk, EIO), held in memory until a save of their session succeeds.

A command that fails tears its session's sandbox down and records it failed (``_guarded``).
When the disk took neither the command's end nor that failure, the record kept the state the
command had reached: starting, creating, or running with no sandbox. No command leaves those
(a start answers Conflict, or "running" without starting one) until the daemon's restart:
the state DB holds what was written, and the service is the one that knows what was done. A
held record is what every command and listing sees; the next save of the session (its next
transition, a touch) writes the whole record, and a daemon that dies first finds the disk's
state and settles it (``reconcile``)."""

from __future__ import annotations

import logging

from ironclawd.domain.session import Session
from ironclawd.errors import HostError
from ironclawd.ports import SessionRecords

log = logging.getLogger("ironclawd.sessions")


class HeldRecords:
    """``SessionRecords`` over ``store``, with the records ``hold`` could not write."""

    def __init__(self, store: SessionRecords) -> None:
        self._store = store
        self._held: dict[str, Session] = {}

    def insert(self, session: Session) -> None:
        self._store.insert(session)

    def save(self, session: Session) -> None:
        self._store.save(session)
        self._held.pop(session.sid, None)  # written: the disk says what was done again

    def get(self, sid: str) -> Session:
        held = self._held.get(sid)
        return held if held is not None else self._store.get(sid)

    def list_sessions(self) -> list[Session]:
        return [self._held.get(s.sid, s) for s in self._store.list_sessions()]

    def delete(self, sid: str) -> None:
        self._store.delete(sid)
        self._held.pop(sid, None)

    def hold(self, session: Session) -> None:
        """Save ``session``, a record of what was done to its sandbox already (torn down): if
        the disk takes no record, keep it here instead (logged), never raise: what was done is
        not undone by it, and the session must not stay in a state no command leaves."""
        try:
            self.save(session)
        except HostError as exc:
            log.error(
                "session %s %s: not saved (%s); kept in memory until the session's next save",
                session.sid, session.state.value, exc,
            )  # fmt: skip
            self._held[session.sid] = session
