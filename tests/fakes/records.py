"""In-memory records (``ports.records``): what store/state.py keeps in SQLCipher, in dicts."""

from __future__ import annotations

from dataclasses import replace

from ironclawd.domain.changes import Change
from ironclawd.domain.messages import GENESIS, Reply
from ironclawd.domain.reply_bounds import ReplyUsage
from ironclawd.domain.session import Session, State, check_sid
from ironclawd.errors import AlreadyExists, NotFound


class MemorySessions:
    """``SessionRecords``."""

    def __init__(self, *sessions: Session) -> None:
        self.rows: dict[str, Session] = {s.sid: s for s in sessions}
        self.calls: list[tuple[str, str]] = []  # (method, sid)

    def insert(self, session: Session) -> None:
        self.calls.append(("insert", session.sid))
        if session.sid in self.rows:
            raise AlreadyExists(f"session {session.sid} already exists")
        self.rows[session.sid] = session

    def save(self, session: Session) -> None:
        self.calls.append(("save", session.sid))
        if session.sid not in self.rows:
            raise NotFound(f"session {session.sid} not found")
        self.rows[session.sid] = session

    def get(self, sid: str) -> Session:
        if sid not in self.rows:
            raise NotFound(f"session {sid} not found")
        return self.rows[sid]

    def list_sessions(self) -> list[Session]:
        return sorted(self.rows.values(), key=lambda s: (s.created_at, s.sid))

    def delete(self, sid: str) -> None:
        self.calls.append(("delete", sid))
        self.rows.pop(sid, None)


class StaticSessions:
    """``SessionLookup`` over a fixed sid -> agent table; any other sid is ``default``'s, or
    NotFound without one. Every session it returns is running. A malformed id is refused as
    the real lookup refuses it (tests/contract/test_inbox_ports.py holds the two together)."""

    def __init__(self, default: str | None = None, **agents: str) -> None:
        for sid in agents:
            check_sid(sid)
        self._agents = agents
        self._default = default
        self.calls: list[str] = []

    def get(self, sid: str) -> Session:
        self.calls.append(sid)
        agent = self._agents.get(check_sid(sid), self._default)
        if agent is None:
            raise NotFound(f"session {sid} not found")
        return Session(sid, agent, State.RUNNING, 0.0, 0.0, 0.0)


class MemoryReplies:
    """``ReplyRecords``."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[int, Reply]] = {}
        self.pruned_to: dict[str, int] = {}
        self.sent_by: dict[str, set[str]] = {}
        self.usage: dict[str, ReplyUsage] = {}

    def add_replies(self, sid: str, replies: list[Reply], usage: ReplyUsage | None = None) -> None:
        table = self.rows.setdefault(sid, {})
        if any(r.seq in table for r in replies):
            raise AlreadyExists(f"session {sid}: reply already recorded")
        table.update((r.seq, r) for r in replies)
        if usage is not None:
            self.usage[sid] = usage

    def reply_usage(self, sid: str) -> ReplyUsage:
        return self.usage.get(sid, ReplyUsage())

    def last_reply(self, sid: str) -> tuple[int, bytes]:
        table = self.rows.get(sid)
        if not table:
            return 0, GENESIS
        newest = table[max(table)]
        return newest.seq, newest.chain

    def replies_after(self, sid: str, after: int, limit: int = 1000) -> list[Reply]:
        table = self.rows.get(sid, {})
        return [table[s] for s in sorted(table) if s > after][:limit]

    def set_pruned(self, sid: str, seq: int) -> None:
        self.pruned_to[sid] = max(seq, self.pruned_to.get(sid, 0))

    def pruned(self, sid: str) -> int:
        return self.pruned_to.get(sid, 0)

    def add_sender(self, sid: str, sender: str) -> None:
        self.sent_by.setdefault(sid, set()).add(sender)

    def senders(self, sid: str) -> frozenset[str]:
        return frozenset(self.sent_by.get(sid, ()))


class MemorySessionKeys:
    """``SessionKeyRecords``."""

    def __init__(self, replies: MemoryReplies | None = None) -> None:
        self.keys: dict[str, bytes] = {}
        self._replies = replies

    def put_wrapped_key(self, sid: str, wrapped: bytes) -> None:
        self.keys[sid] = wrapped
        if self._replies is not None:
            self._replies.pruned_to.pop(sid, None)
            self._replies.sent_by.pop(sid, None)

    def wrapped_key(self, sid: str) -> bytes | None:
        return self.keys.get(sid)

    def destroy_session_data(self, sid: str) -> None:
        self.keys.pop(sid, None)
        if self._replies is not None:
            self._replies.rows.pop(sid, None)
            self._replies.pruned_to.pop(sid, None)
            self._replies.sent_by.pop(sid, None)
            self._replies.usage.pop(sid, None)


class MemoryAgents:
    """``AgentRecords``."""

    def __init__(self) -> None:
        self.specs: dict[str, str] = {}
        self.calls: list[tuple[str, float]] = []  # (name, now) of each put

    def put_agent(self, name: str, spec_json: str, now: float) -> None:
        self.calls.append((name, now))
        self.specs[name] = spec_json

    def agents(self) -> dict[str, str]:
        return dict(sorted(self.specs.items()))


class MemoryChanges:
    """``ChangeRecords``: ``save_change`` updates only the decision fields, as the real one."""

    def __init__(self) -> None:
        self.changes: dict[str, Change] = {}

    def insert_change(self, change: Change) -> None:
        if change.id in self.changes:
            raise AlreadyExists(f"change {change.id} already exists")
        self.changes[change.id] = change

    def save_change(self, change: Change) -> None:
        if change.id in self.changes:
            self.changes[change.id] = replace(
                self.changes[change.id], state=change.state, decided_by=change.decided_by,
                decided_at=change.decided_at, note=change.note,
            )  # fmt: skip

    def get_change(self, change_id: str) -> Change:
        if change_id not in self.changes:
            raise NotFound(f"change {change_id} not found")
        return self.changes[change_id]

    def list_changes(self, state: str | None = None) -> list[Change]:
        found = [c for c in self.changes.values() if state is None or c.state.value == state]
        return sorted(found, key=lambda c: (c.created_at, c.id))

    def list_changes_page(
        self, state: str | None, after: str, limit: int, max_bytes: int
    ) -> tuple[list[Change], bool]:
        start = (self.get_change(after).created_at, after) if after else (float("-inf"), "")
        found = [c for c in self.list_changes(state) if (c.created_at, c.id) > start]
        page: list[Change] = []
        size = 0
        for change in found[:limit]:
            size += sum(len(t.encode("utf-8", "surrogatepass"))
                        for t in (change.payload, change.before, change.after))  # fmt: skip
            if page and size > max_bytes:
                return page, True
            page.append(change)
        return page, len(found) > limit

    def count_changes_since(self, submitter: str, since: float) -> int:
        return sum(c.submitter == submitter and c.created_at >= since
                   for c in self.changes.values())  # fmt: skip


class MemoryAuditHead:
    """``AuditHead``."""

    def __init__(self) -> None:
        self.head: tuple[int, str] | None = None
        self.calls: list[tuple[int, str]] = []

    def set_audit_head(self, seq: int, mac: str) -> None:
        self.calls.append((seq, mac))
        if self.head is None or seq > self.head[0]:  # never an older one, as the real store
            self.head = (seq, mac)

    def audit_head(self) -> tuple[int, str] | None:
        return self.head
