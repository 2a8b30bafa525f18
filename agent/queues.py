"""The agent's side of its session queues (the host's side: ironclawd/store/queues.py).

inbound.db is mounted read-only and opened read-only and query-only; outbound.db is this
process's own, and it is its only writer. File locks do not cross the gVisor boundary, so a read
of inbound.db that meets the host mid-commit fails (hot journal on a read-only file, or a page
that does not decrypt) and is retried; the rows read must run without a gap up to the seq the
host announced.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import sqlcipher3

OUTBOUND_SCHEMA = (
    "CREATE TABLE messages (seq INTEGER PRIMARY KEY, in_reply_to INTEGER NOT NULL, "
    "created_at REAL NOT NULL, body TEXT NOT NULL)"
)
QUEUE_VERSION = 1
INCREMENTAL = 2  # PRAGMA auto_vacuum
# Pruning runs in transactions this small, so that each one's journal fits in HEADROOM: rows
# deleted (a single DELETE of 40,000 rows of 300 bytes journaled 13 MiB) and pages given back
# (256 pages of 1 MB replies journaled 2 MiB, 64 pages at most ~0.5 MiB). Not fewer rows: an
# ordinary prune (the host offers every 256 replies) is one transaction, as each is costly in
# the sandbox; at 64 rows a transaction the red team's kill test pruned under half its rows.
PRUNE_ROWS = 1024
VACUUM_PAGES = 64
# What the file leaves free of its tmpfs (at most a quarter of it) for the journals of its
# commits: once it has grown to the rest, a reply is refused as a full disk while a prune,
# which is what makes room again, still has space to journal in.
HEADROOM = 2 * 1024 * 1024
READ_ATTEMPTS = 200
READ_BACKOFF = 0.002

Row = tuple[int, str]


class QueueError(Exception):
    pass


def read_key(path: Path) -> bytes:
    text = path.read_text(encoding="ascii").strip()
    key = bytes.fromhex(text)
    if len(key) != 32:
        raise QueueError(f"session key {path}: expected 32 bytes, got {len(key)}")
    return key


def _keyed(conn: sqlcipher3.Connection, key: bytes) -> None:
    conn.execute(f"PRAGMA key = \"x'{key.hex()}'\"")


def _check_version(conn: sqlcipher3.Connection, path: Path, known: tuple[int, ...]) -> None:
    """Refuse a queue file of a format this agent does not know (an ironclawd of another
    version made it: its rows would be misread, or written in a format its reader misreads)."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version not in known:
        raise QueueError(
            f"refusing {path}: format version {version}, this agent knows version "
            f"{QUEUE_VERSION} (made by another ironclawd version)"
        )


class Inbound:
    """The agent's one read-only connection to inbound.db, opened and keyed once (a fresh
    connection per message cost more than the read: open, key, schema). SQLite drops its page
    cache at the start of a read when page 1 changed, and every host commit changes page 1 (a
    new IV re-encrypts it whole), so a kept connection sees each commit. A read that fails, or
    that comes back short of what the host announced, may have cached pages of a commit caught
    half-way (locks do not cross gVisor): the connection is dropped and the next try opens a
    fresh one."""

    def __init__(self, path: Path, key: bytes) -> None:
        self._path = path
        self._key = key
        self._conn: sqlcipher3.Connection | None = None

    def read_after(self, after: int, up_to: int | None) -> list[Row]:
        """Messages with seq in (after, up_to]; with up_to=None whatever is there now."""
        last_error: Exception | None = None
        for _attempt in range(READ_ATTEMPTS):
            if self._conn is None and not self._path.exists():
                if up_to is None or up_to <= after:
                    return []
                last_error = QueueError(f"{self._path} does not exist yet")
            else:
                try:
                    rows = self._read(after, up_to)
                except sqlcipher3.Error as exc:
                    last_error = exc
                else:
                    seqs = [seq for seq, _ in rows]
                    complete = up_to is None or up_to <= after or (seqs and seqs[-1] >= up_to)
                    if seqs == list(range(after + 1, after + 1 + len(seqs))) and complete:
                        return rows
                    last_error = QueueError(f"announced {up_to}, read {seqs[:3]}..")
                self.close()
            time.sleep(READ_BACKOFF)
        raise QueueError(f"reading {self._path}: gave up: {last_error}")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> sqlcipher3.Connection:
        if self._conn is None:
            # nolock: the host, the file's only writer, never sees the sandbox's locks, so taking
            # them was four calls through the sentry per read for nothing (a commit caught
            # half-way is detected and retried here either way).
            conn = sqlcipher3.connect(
                f"file:{self._path}?mode=ro&nolock=1", uri=True, isolation_level=None
            )
            try:
                _keyed(conn, self._key)
                conn.execute("PRAGMA query_only = ON")
                # 0: the host has yet to make its table (the read fails, and is tried again).
                _check_version(conn, self._path, (0, QUEUE_VERSION))
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _read(self, after: int, up_to: int | None) -> list[Row]:
        # fetchall(): the statement runs to its end, which ends the read transaction.
        rows = (
            self._connection()
            .execute(
                "SELECT seq, body FROM messages WHERE seq > ? AND seq <= ? ORDER BY seq",
                (after, up_to if up_to is not None else 2**62),
            )
            .fetchall()
        )
        return [(int(seq), str(body)) for seq, body in rows]


class Outbound:
    def __init__(self, path: Path, key: bytes) -> None:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        # nolock: this process is the file's only writer, and the host, its reader, never sees
        # the sandbox's locks; taking them cost 9 calls through the sentry per commit. Not
        # locking_mode=EXCLUSIVE: that also stops re-reading page 1 at each transaction, so a
        # connection never sees what another writer did (docs/development.md).
        self._db = sqlcipher3.connect(f"file:{path}?nolock=1", uri=True, isolation_level=None)
        _keyed(self._db, key)
        # The file lives on the session's tmpfs, so an fsync makes nothing more durable: what a
        # reboot loses is lost either way, and a write(2) the sentry returned from is already
        # in the host's file (a killed sandbox keeps it; the journal still rolls back a commit
        # it cut short). A kept journal, truncated at each commit, spares the create, chown and
        # unlink through the gofer that DELETE mode costs per commit. Together: sandbox CPU
        # per message 15.1 -> 9.5 ms, 20 sessions (docs/development.md). The host takes an
        # empty journal as "no commit under way" (ironclawd/store/outbound.py).
        self._db.execute("PRAGMA journal_mode = TRUNCATE")
        self._db.execute("PRAGMA synchronous = OFF")
        # SQLCipher's default (ON) overwrites every page a delete frees, so pruning journaled
        # the whole file: with a 20 MiB reply, 21.9 MB of journal beside a 21.9 MB file, past
        # the tmpfs's 32 MiB. Off: 0.46 MB. What a freed page keeps is ciphertext under the key
        # this process and the host hold anyway.
        self._db.execute("PRAGMA secure_delete = OFF")
        _check_version(self._db, path, (0, QUEUE_VERSION))
        if self._db.execute("PRAGMA user_version").fetchone()[0] == 0:
            # Before the first table: pages that pruning frees can then be given back to the
            # session's tmpfs (a file made by an older agent keeps them for its new rows).
            self._db.execute("PRAGMA auto_vacuum = INCREMENTAL")
            self._db.executescript(
                f"BEGIN IMMEDIATE; {OUTBOUND_SCHEMA}; PRAGMA user_version = {QUEUE_VERSION}; "
                "COMMIT;"
            )
        self._gives_back = self._db.execute("PRAGMA auto_vacuum").fetchone()[0] == INCREMENTAL
        self._leave_headroom(path.parent)

    def _leave_headroom(self, directory: Path) -> None:
        """Let the file grow to its file system's size less HEADROOM, no further (SQLite then
        refuses an append as "database or disk is full"). Without it the tmpfs filled up to
        its last page, and the prune that would make room had no space for its own journal."""
        st = os.statvfs(directory)
        size = st.f_blocks * st.f_frsize
        page = int(self._db.execute("PRAGMA page_size").fetchone()[0])
        if size and page:
            pages = (size - min(HEADROOM, size // 4)) // page
            self._db.execute(f"PRAGMA max_page_count = {pages}").fetchone()

    def last_seq(self) -> int:
        return int(self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM messages").fetchone()[0])

    def last_answered(self) -> int:
        """The newest inbound seq already answered: where a restarted agent resumes."""
        row = self._db.execute("SELECT COALESCE(MAX(in_reply_to), 0) FROM messages").fetchone()
        return int(row[0])

    def prune(self, up_to: int) -> None:
        """Drop the rows the host says it has ingested (seq <= ``up_to``), all but the newest:
        its seq and ``in_reply_to`` are where the next reply's seq and a restarted agent's
        resumption come from. The file lives on the session's tmpfs, of a fixed size, and the
        host copies all of it at each ingest, so it must not grow with the session's age.
        A few rows and pages per transaction, so that no journal is large: the tmpfs may be
        full, which is when pruning matters most (HEADROOM)."""
        last = min(up_to, self.last_seq() - 1)
        while self._db.execute(
            "DELETE FROM messages WHERE seq IN "
            "(SELECT seq FROM messages WHERE seq <= ? ORDER BY seq LIMIT ?)",
            (last, PRUNE_ROWS),
        ).rowcount:
            pass
        while self._gives_back and self._db.execute("PRAGMA freelist_count").fetchone()[0]:
            self._db.execute(f"PRAGMA incremental_vacuum({VACUUM_PAGES})").fetchall()

    def append(self, in_reply_to: int, body: str) -> int:
        cur = self._db.execute(
            "INSERT INTO messages (in_reply_to, created_at, body) VALUES (?, ?, ?)",
            (in_reply_to, time.time(), body),
        )
        if cur.lastrowid is None:
            raise QueueError("appending a reply: no row id")
        return int(cur.lastrowid)
