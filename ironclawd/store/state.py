"""The host state DB: sessions and their lifecycle state, persisted after every transition.

SQLite through sqlcipher3 (the store layer's one database driver), WAL, synchronous=FULL so a
transition that returned is on disk when the daemon is killed the next instant. It holds
metadata only (ids, states, times); message data lives in the per-session encrypted queues.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlcipher3

from ironclawd.domain.messages import GENESIS, Reply
from ironclawd.domain.reply_bounds import ReplyUsage, stored_bytes
from ironclawd.domain.session import Session, State
from ironclawd.errors import AlreadyExists, HostError, NotFound
from ironclawd.store.translate import translated

if TYPE_CHECKING:
    from ironclawd.domain.changes import Change

SCHEMA_VERSION = 10
# The event ids of removed sessions' channel messages kept, newest first: one its channel offers
# again (a Matrix batch synced again, a webhook sender's retry) is still a duplicate.
KEEP_GONE_EVENTS = 10_000
_MIGRATIONS = {
    1: """
        CREATE TABLE sessions (
            sid TEXT PRIMARY KEY,
            agent TEXT NOT NULL,
            state TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            last_active_at REAL NOT NULL,
            error TEXT NOT NULL DEFAULT '',
            platform TEXT NOT NULL DEFAULT ''
        );
    """,
    2: """
        CREATE TABLE session_keys (sid TEXT PRIMARY KEY, wrapped BLOB NOT NULL);
        CREATE TABLE replies (
            sid TEXT NOT NULL,
            seq INTEGER NOT NULL,
            in_reply_to INTEGER NOT NULL,
            created_at REAL NOT NULL,
            body TEXT NOT NULL,
            chain BLOB NOT NULL,
            PRIMARY KEY (sid, seq)
        );
    """,
    3: """
        CREATE TABLE agents (name TEXT PRIMARY KEY, spec TEXT NOT NULL, updated_at REAL NOT NULL);
        CREATE TABLE changes (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            agent TEXT NOT NULL,
            payload TEXT NOT NULL,
            reason TEXT NOT NULL,
            submitter TEXT NOT NULL,
            before TEXT NOT NULL,
            after TEXT NOT NULL,
            hash TEXT NOT NULL,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL,
            state TEXT NOT NULL,
            decided_by TEXT NOT NULL,
            decided_at REAL NOT NULL,
            note TEXT NOT NULL
        );
        CREATE INDEX changes_by_state ON changes (state, created_at);
        CREATE TABLE audit_head (id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL,
                                 mac TEXT NOT NULL);
    """,
    # Channels (store/channel_state.py): cursors, which session a sender or room talks to, the
    # receive redo log, messages and their replies' deliveries, messages held for an operator.
    4: """
        CREATE TABLE channel_cursors (channel TEXT PRIMARY KEY, cursor TEXT NOT NULL);
        CREATE TABLE channel_sessions (channel TEXT NOT NULL, where_ TEXT NOT NULL,
                                       key TEXT NOT NULL, sid TEXT NOT NULL,
                                       PRIMARY KEY (channel, where_, key));
        CREATE TABLE channel_receiving (
            channel TEXT NOT NULL, event_id TEXT NOT NULL, sid TEXT NOT NULL,
            client_id TEXT NOT NULL, where_ TEXT NOT NULL, thread TEXT NOT NULL,
            sender TEXT NOT NULL, text TEXT NOT NULL, reply_url TEXT NOT NULL,
            PRIMARY KEY (channel, event_id)
        );
        CREATE TABLE channel_messages (
            sid TEXT NOT NULL, seq INTEGER NOT NULL, channel TEXT NOT NULL, where_ TEXT NOT NULL,
            thread TEXT NOT NULL, event_id TEXT NOT NULL, sender TEXT NOT NULL,
            reply_url TEXT NOT NULL, PRIMARY KEY (sid, seq)
        );
        CREATE UNIQUE INDEX channel_messages_by_event ON channel_messages (channel, event_id);
        CREATE TABLE deliveries (
            sid TEXT NOT NULL, reply_seq INTEGER NOT NULL, channel TEXT NOT NULL,
            state TEXT NOT NULL, attempts INTEGER NOT NULL, next_at REAL NOT NULL,
            last_error TEXT NOT NULL, updated_at REAL NOT NULL, PRIMARY KEY (sid, reply_seq)
        );
        CREATE INDEX deliveries_by_channel ON deliveries (channel, state, updated_at);
        CREATE TABLE held (
            id INTEGER PRIMARY KEY AUTOINCREMENT, channel TEXT NOT NULL, where_ TEXT NOT NULL,
            sender TEXT NOT NULL, event_id TEXT NOT NULL, thread TEXT NOT NULL,
            text TEXT NOT NULL, mentioned INTEGER NOT NULL, received_at REAL NOT NULL,
            UNIQUE (channel, event_id)
        );
    """,
    # Up to which reply each session's agent was told it may drop its rows ("ingested <seq>").
    5: """
        CREATE TABLE outbound_pruned (sid TEXT PRIMARY KEY, seq INTEGER NOT NULL);
    """,
    # Who had sent a submitting session messages (a JSON list; four-eyes, services/gateway.py),
    # and who has sent each session messages, for its life.
    6: """
        ALTER TABLE changes ADD COLUMN drivers TEXT NOT NULL DEFAULT '[]';
        CREATE TABLE session_senders (sid TEXT NOT NULL, sender TEXT NOT NULL,
                                      PRIMARY KEY (sid, sender));
    """,
    # A session's channel rows go with it (destroy_session_data); the (channel, event id) of
    # its messages stay, bounded (KEEP_GONE_EVENTS), for the de-duplication of events offered
    # again. Rows that sessions removed before this left are taken away here.
    7: """
        CREATE TABLE channel_events_gone (
            id INTEGER PRIMARY KEY AUTOINCREMENT, channel TEXT NOT NULL, event_id TEXT NOT NULL,
            sid TEXT NOT NULL, seq INTEGER NOT NULL, UNIQUE (channel, event_id)
        );
        INSERT OR IGNORE INTO channel_events_gone (channel, event_id, sid, seq)
            SELECT channel, event_id, sid, seq FROM channel_messages
            WHERE sid NOT IN (SELECT sid FROM sessions) ORDER BY rowid;
        DELETE FROM channel_events_gone
            WHERE id <= (SELECT max(id) FROM channel_events_gone) - 10000;
        DELETE FROM channel_messages WHERE sid NOT IN (SELECT sid FROM sessions);
        DELETE FROM deliveries WHERE sid NOT IN (SELECT sid FROM sessions);
        DELETE FROM channel_receiving WHERE sid NOT IN (SELECT sid FROM sessions);
        DELETE FROM channel_sessions WHERE sid NOT IN (SELECT sid FROM sessions);
    """,
    # Each held message's size (UTF-8 bytes of its text), and an index that counts a channel's
    # held messages and their bytes without reading their texts: holding is capped per channel.
    8: """
        ALTER TABLE held ADD COLUMN size INTEGER NOT NULL DEFAULT 0;
        UPDATE held SET size = length(CAST(text AS BLOB));
        CREATE INDEX held_by_channel ON held (channel, size);
    """,
    # A session's restart mark (domain/session.py), a column of its own: it was a text in
    # ``error``, shown as one, and recognised by equality. The text the daemons before this
    # wrote (exactly, '' being a quote in SQL) becomes the mark.
    9: """
        ALTER TABLE sessions ADD COLUMN restarting INTEGER NOT NULL DEFAULT 0;
        UPDATE sessions SET restarting = 1, error = ''
            WHERE error = 'restarting on its agent''s new spec: it starts again when the '
                          || 'approved change is applied';
    """,
    # What each session's replies take here, kept with them (domain/reply_bounds.py ReplyUsage):
    # summing it at each start would read every body. Sessions of an older daemon get theirs
    # once, here (a session with no reply has no row: all zero).
    10: """
        CREATE TABLE reply_usage (sid TEXT PRIMARY KEY, bytes INTEGER NOT NULL,
                                  answered INTEGER NOT NULL, run INTEGER NOT NULL);
        INSERT INTO reply_usage (sid, bytes, answered, run)
            SELECT sid, sum(ironclaw_stored_bytes(length(CAST(body AS BLOB)))),
                   max(in_reply_to), 0 FROM replies GROUP BY sid;
        UPDATE reply_usage SET run = (SELECT count(*) FROM replies AS r
            WHERE r.sid = reply_usage.sid AND r.in_reply_to = reply_usage.answered);
    """,
}
_CHANGE_COLUMNS = (
    "id, kind, agent, payload, reason, submitter, before, after, hash, created_at, expires_at, "
    "state, decided_by, decided_at, note, drivers"
)
# Interpolated into SQL text below: a constant, never input.
_COLUMNS = "sid, agent, state, created_at, updated_at, last_active_at, error, platform, restarting"


class StateStore:
    """Thread-safe access to the state DB (calls come from the event loop and its threads)."""

    def __init__(self, path: Path, key: bytes) -> None:
        self._path = path
        self._lock = threading.Lock()
        # Sessions as last read or written: ``get`` is on every send, model call and watch, and
        # this process is the DB's only writer. Filled and changed only under the lock, together
        # with the row, so a reader never puts back an older version.
        self._sessions: dict[str, Session] = {}
        with translated(f"opening state DB {path}"):
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            os.close(fd)
            self._db = sqlcipher3.connect(str(path), check_same_thread=False, isolation_level=None)
            try:
                self._db.execute(f"PRAGMA key = \"x'{key.hex()}'\"")
                self._db.execute("PRAGMA cipher_memory_security = ON")
                # Deleted session keys must not linger in free pages.
                self._db.execute("PRAGMA secure_delete = ON")
                self._db.execute("PRAGMA journal_mode = WAL")
                self._db.execute("PRAGMA synchronous = FULL")
                self._db.create_function("ironclaw_stored_bytes", 1, stored_bytes,
                                         deterministic=True)  # fmt: skip
                self._migrate()
            except BaseException:
                with contextlib.suppress(sqlcipher3.Error):
                    self._db.close()
                raise

    @contextlib.contextmanager
    def _op(self, doing: str) -> Iterator[None]:
        """One operation on the DB: under the lock, driver errors translated naming it."""
        with self._lock, translated(f"{doing} in state DB {self._path}", self._db):
            yield

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise HostError(
                f"state DB {self._path} has schema {version}, newer than this ironclawd "
                f"({SCHEMA_VERSION}): refusing to downgrade"
            )
        for step in range(version + 1, SCHEMA_VERSION + 1):
            # One script, one transaction: executescript() would commit a transaction opened
            # with execute() before running, so the BEGIN belongs inside the script.
            self._db.executescript(
                f"BEGIN IMMEDIATE; {_MIGRATIONS[step]}; PRAGMA user_version = {step}; COMMIT;"
            )

    @contextlib.contextmanager
    def shared(self, doing: str) -> Iterator[Any]:
        """The connection under the lock, errors translated naming ``doing``: for a store
        module keeping its tables in this DB (store/channel_state.py)."""
        with self._op(doing):
            yield self._db

    def close(self) -> None:
        with self._op("closing"):
            self._db.close()
            self._sessions.clear()

    def insert(self, session: Session) -> None:
        with self._op(f"inserting session {session.sid}"):
            try:
                self._db.execute(
                    f"INSERT INTO sessions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
                    _row(session),
                )
            except sqlcipher3.IntegrityError:
                raise AlreadyExists(f"session {session.sid} already exists") from None
            self._sessions[session.sid] = session

    def save(self, session: Session) -> None:
        with self._op(f"saving session {session.sid}"):
            cur = self._db.execute(
                "UPDATE sessions SET agent=?, state=?, created_at=?, updated_at=?, "
                "last_active_at=?, error=?, platform=?, restarting=? WHERE sid=?",
                (*_row(session)[1:], session.sid),
            )
            if cur.rowcount == 1:
                self._sessions[session.sid] = session
        if cur.rowcount != 1:
            raise NotFound(f"session {session.sid} not found")

    def get(self, sid: str) -> Session:
        cached = self._sessions.get(sid)
        if cached is not None:
            return cached
        with self._op(f"reading session {sid}"):
            row = self._db.execute(
                f"SELECT {_COLUMNS} FROM sessions WHERE sid=?",  # noqa: S608
                (sid,),
            ).fetchone()
            if row is None:
                raise NotFound(f"session {sid} not found")
            session = _session(row)
            self._sessions[sid] = session
        return session

    def list_sessions(self) -> list[Session]:
        with self._op("listing sessions"):
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM sessions ORDER BY created_at, sid"  # noqa: S608
            ).fetchall()
        return [_session(r) for r in rows]

    def delete(self, sid: str) -> None:
        with self._op(f"deleting session {sid}"):
            self._db.execute("DELETE FROM sessions WHERE sid=?", (sid,))
            self._sessions.pop(sid, None)

    # -- session keys (wrapped) and ingested replies ------------------------------------

    def put_wrapped_key(self, sid: str, wrapped: bytes) -> None:
        """A key is put only for a new session: nothing of its outbound queue is pruned yet
        (a pruned seq left by a removed session of the same id must not carry over)."""
        with self._op(f"storing the key of session {sid}"):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO session_keys (sid, wrapped) VALUES (?, ?)",
                    (sid, wrapped),
                )
                self._db.execute("DELETE FROM outbound_pruned WHERE sid = ?", (sid,))
                self._db.execute("DELETE FROM session_senders WHERE sid = ?", (sid,))
            except BaseException:
                if self._db.in_transaction:  # a full disk rolled it back already
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def wrapped_key(self, sid: str) -> bytes | None:
        with self._op(f"reading the key of session {sid}"):
            row = self._db.execute(
                "SELECT wrapped FROM session_keys WHERE sid = ?", (sid,)
            ).fetchone()
        return bytes(row[0]) if row else None

    def destroy_session_data(self, sid: str) -> None:
        """Forget a session's key, ingested replies and channel rows (secure_delete scrubs the
        pages). The channel rows grew by a message and a delivery per channel message for the
        host's life, every start followed each removed session again, and a later session of
        the same id took over its deliveries (found by a review). Only the (channel, event id)
        of its messages stay, for ``KEEP_GONE_EVENTS`` of them over all sessions: an event
        offered again after the removal is still a duplicate (store/channel_state.py)."""
        with self._op(f"destroying the data of session {sid}"):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for table in ("session_keys", "replies", "reply_usage", "outbound_pruned",
                              "session_senders"):  # fmt: skip
                    self._db.execute(f"DELETE FROM {table} WHERE sid = ?", (sid,))  # noqa: S608
                self._db.execute(
                    "INSERT OR IGNORE INTO channel_events_gone (channel, event_id, sid, seq) "
                    "SELECT channel, event_id, sid, seq FROM channel_messages WHERE sid = ? "
                    "ORDER BY seq",
                    (sid,),
                )
                self._db.execute(
                    "DELETE FROM channel_events_gone "
                    "WHERE id <= (SELECT max(id) FROM channel_events_gone) - ?",
                    (KEEP_GONE_EVENTS,),
                )
                for table in ("channel_messages", "deliveries", "channel_receiving",
                              "channel_sessions"):  # fmt: skip
                    self._db.execute(f"DELETE FROM {table} WHERE sid = ?", (sid,))  # noqa: S608
            except BaseException:
                if self._db.in_transaction:  # a full disk rolled it back already
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def add_sender(self, sid: str, sender: str) -> None:
        with self._op(f"recording a sender of session {sid}"):
            self._db.execute(
                "INSERT OR IGNORE INTO session_senders (sid, sender) VALUES (?, ?)", (sid, sender)
            )

    def senders(self, sid: str) -> frozenset[str]:
        with self._op(f"reading the senders of session {sid}"):
            rows = self._db.execute(
                "SELECT sender FROM session_senders WHERE sid = ?", (sid,)
            ).fetchall()
        return frozenset(str(row[0]) for row in rows)

    def add_replies(self, sid: str, replies: list[Reply], usage: ReplyUsage | None = None) -> None:
        """``usage``: what the session's replies take with these (kept in one transaction)."""
        with self._op(f"adding replies of session {sid}"):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT INTO replies (sid, seq, in_reply_to, created_at, body, chain) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    [(sid, r.seq, r.in_reply_to, r.created_at, r.body, r.chain) for r in replies],
                )
                if usage is not None:
                    self._db.execute(
                        "INSERT OR REPLACE INTO reply_usage (sid, bytes, answered, run) "
                        "VALUES (?, ?, ?, ?)",
                        (sid, usage.bytes, usage.answered, usage.run),
                    )
            except BaseException:
                if self._db.in_transaction:  # a full disk rolled it back already
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def last_reply(self, sid: str) -> tuple[int, bytes]:
        """(seq, chain) of the newest ingested reply; (0, GENESIS) if none."""
        with self._op(f"reading the last reply of session {sid}"):
            row = self._db.execute(
                "SELECT seq, chain FROM replies WHERE sid = ? ORDER BY seq DESC LIMIT 1", (sid,)
            ).fetchone()
        return (int(row[0]), bytes(row[1])) if row else (0, GENESIS)

    def reply_usage(self, sid: str) -> ReplyUsage:
        with self._op(f"reading what the replies of session {sid} take"):
            row = self._db.execute(
                "SELECT bytes, answered, run FROM reply_usage WHERE sid = ?", (sid,)
            ).fetchone()
        return ReplyUsage(int(row[0]), int(row[1]), int(row[2])) if row else ReplyUsage()

    def replies_after(self, sid: str, after: int, limit: int = 1000) -> list[Reply]:
        with self._op(f"reading replies of session {sid}"):
            rows = self._db.execute(
                "SELECT seq, in_reply_to, created_at, body, chain FROM replies "
                "WHERE sid = ? AND seq > ? ORDER BY seq LIMIT ?",
                (sid, after, limit),
            ).fetchall()
        return [Reply(int(a), int(b), float(c), str(d), bytes(e)) for a, b, c, d, e in rows]

    def set_pruned(self, sid: str, seq: int) -> None:
        with self._op(f"recording the pruned replies of session {sid}"):
            self._db.execute(
                "INSERT INTO outbound_pruned (sid, seq) VALUES (?, ?) ON CONFLICT (sid) "
                "DO UPDATE SET seq = MAX(seq, excluded.seq)",
                (sid, seq),
            )

    def pruned(self, sid: str) -> int:
        with self._op(f"reading the pruned replies of session {sid}"):
            row = self._db.execute(
                "SELECT seq FROM outbound_pruned WHERE sid = ?", (sid,)
            ).fetchone()
        return int(row[0]) if row else 0

    # -- registry, changes, audit head ----------------------------------------------------

    def put_agent(self, name: str, spec_json: str, now: float) -> None:
        with self._op(f"storing agent {name}"):
            self._db.execute(
                "INSERT OR REPLACE INTO agents (name, spec, updated_at) VALUES (?, ?, ?)",
                (name, spec_json, now),
            )

    def agents(self) -> dict[str, str]:
        with self._op("listing agents"):
            rows = self._db.execute("SELECT name, spec FROM agents ORDER BY name").fetchall()
        return {str(n): str(s) for n, s in rows}

    def insert_change(self, change: Change) -> None:
        with self._op(f"inserting change {change.id}"):
            self._db.execute(
                f"INSERT INTO changes ({_CHANGE_COLUMNS}) VALUES "  # noqa: S608
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                _change_row(change),
            )

    def save_change(self, change: Change) -> None:
        with self._op(f"saving change {change.id}"):
            self._db.execute(
                "UPDATE changes SET state=?, decided_by=?, decided_at=?, note=? WHERE id=?",
                (change.state.value, change.decided_by, change.decided_at, change.note, change.id),
            )

    def get_change(self, change_id: str) -> Change:
        with self._op(f"reading change {change_id}"):
            row = self._db.execute(
                f"SELECT {_CHANGE_COLUMNS} FROM changes WHERE id=?",  # noqa: S608
                (change_id,),
            ).fetchone()
        if row is None:
            raise NotFound(f"change {change_id} not found")
        return _change(row)

    def list_changes(self, state: str | None = None) -> list[Change]:
        with self._op("listing changes"):
            if state is None:
                rows = self._db.execute(
                    f"SELECT {_CHANGE_COLUMNS} FROM changes ORDER BY created_at, id"  # noqa: S608
                ).fetchall()
            else:
                rows = self._db.execute(
                    f"SELECT {_CHANGE_COLUMNS} FROM changes WHERE state=? "  # noqa: S608
                    "ORDER BY created_at, id",
                    (state,),
                ).fetchall()
        return [_change(r) for r in rows]

    def list_changes_page(
        self, state: str | None, after: str, limit: int, max_bytes: int
    ) -> tuple[list[Change], bool]:
        with self._op("listing a page of changes"):
            # The page's ids first, then its rows one by one: sorted whole, the rows of every
            # change (megabytes each) would be read and held to find a page of them.
            where, args = ["TRUE"], []
            if after:
                row = self._db.execute(
                    "SELECT created_at FROM changes WHERE id=?", (after,)
                ).fetchone()
                if row is None:
                    raise NotFound(f"change {after} not found")
                where.append("(created_at > ? OR (created_at = ? AND id > ?))")
                args += [row[0], row[0], after]
            if state is not None:
                where.append("state = ?")
                args.append(state)
            ids = self._db.execute(
                f"SELECT id FROM changes WHERE {' AND '.join(where)} "  # noqa: S608
                "ORDER BY created_at, id LIMIT ?",
                (*args, limit + 1),
            ).fetchall()
            page: list[Change] = []
            size = 0
            for (cid,) in ids[:limit]:
                change = _change(self._db.execute(
                    f"SELECT {_CHANGE_COLUMNS} FROM changes WHERE id=?", (cid,)  # noqa: S608
                ).fetchone())  # fmt: skip
                size += _stored_bytes(change)
                if page and size > max_bytes:
                    return page, True
                page.append(change)
        return page, len(ids) > limit

    def count_changes_since(self, submitter: str, since: float) -> int:
        with self._op(f"counting changes of {submitter}"):
            row = self._db.execute(
                "SELECT count(*) FROM changes WHERE submitter=? AND created_at>=?",
                (submitter, since),
            ).fetchone()
        return int(row[0])

    def set_audit_head(self, seq: int, mac: str) -> None:
        """Remember the audit log's newest record; never an older one. Two threads save heads
        (the batch writer and a durable record), each after its append: saved in the other
        order, an older head let a cut of the newest records go unnoticed."""
        with self._op("storing the audit head"):
            self._db.execute(
                "INSERT INTO audit_head (id, seq, mac) VALUES (1, ?, ?) ON CONFLICT (id) "
                "DO UPDATE SET seq = excluded.seq, mac = excluded.mac "
                "WHERE excluded.seq > audit_head.seq",
                (seq, mac),
            )

    def audit_head(self) -> tuple[int, str] | None:
        with self._op("reading the audit head"):
            row = self._db.execute("SELECT seq, mac FROM audit_head WHERE id=1").fetchone()
        return (int(row[0]), str(row[1])) if row else None


def _change_row(c: Change) -> tuple[object, ...]:
    return (
        c.id, c.kind, c.agent, c.payload, c.reason, c.submitter, c.before, c.after, c.hash,
        c.created_at, c.expires_at, c.state.value, c.decided_by, c.decided_at, c.note,
        json.dumps(list(c.drivers)),
    )  # fmt: skip


def _stored_bytes(c: Change) -> int:
    """What a change's payload, before and after take in UTF-8 (a page's measure)."""
    return sum(len(t.encode("utf-8", "surrogatepass")) for t in (c.payload, c.before, c.after))


def _change(row: tuple[Any, ...]) -> Change:
    from ironclawd.domain.changes import Change, ChangeState  # noqa: PLC0415

    (cid, kind, agent, payload, reason, submitter, before, after, digest, created, expires,
     state, decided_by, decided_at, note, drivers) = row  # fmt: skip
    return Change(
        str(cid), str(kind), str(agent), str(payload), str(reason), str(submitter), str(before),
        str(after), str(digest), float(created), float(expires), ChangeState(state),
        str(decided_by), float(decided_at), str(note), tuple(str(d) for d in json.loads(drivers)),
    )  # fmt: skip


def _row(s: Session) -> tuple[object, ...]:
    return (
        s.sid, s.agent, s.state.value, s.created_at, s.updated_at, s.last_active_at, s.error,
        s.platform, int(s.restarting),
    )  # fmt: skip


def _session(row: tuple[object, ...]) -> Session:
    sid, agent, state, created, updated, active, error, platform, restarting = row
    return Session(
        sid=str(sid), agent=str(agent), state=State(state), created_at=float(created),  # type: ignore[arg-type]
        updated_at=float(updated), last_active_at=float(active), error=str(error),  # type: ignore[arg-type]
        platform=str(platform), restarting=bool(restarting),
    )  # fmt: skip
