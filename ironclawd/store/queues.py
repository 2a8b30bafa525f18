"""Per-session encrypted queues (ARCHITECTURE.md §4): the host's side.

``inbound.db`` — the host is its only writer; the agent reads it through a read-only mount.
``outbound.db`` — the agent is its only writer; the host reads it read-only and *ingests* rows
into the state DB, which is the record.

Both are SQLCipher 4 with the session's raw 256-bit key, rollback journal (WAL's shared memory
does not cross the gVisor boundary), synchronous=FULL. File locks taken in the sandbox are not
seen by the host, so nothing relies on them: each file has one writer, commits are announced on
the control socket, and a reader that meets a hot journal or a half-written page gets an error
and retries (TESTING.md, "SQLite across the gVisor boundary").

The outbound file is written by an untrusted agent: it is opened read-only, not through a
symlink, and its schema must be exactly ours before any row is read.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import sqlcipher3

from ironclawd.errors import HostError, InvalidArgument

INBOUND_SCHEMA = (
    "CREATE TABLE messages (seq INTEGER PRIMARY KEY, created_at REAL NOT NULL, "
    "body TEXT NOT NULL, client_id TEXT UNIQUE)"
)
OUTBOUND_SCHEMA = (
    "CREATE TABLE messages (seq INTEGER PRIMARY KEY, in_reply_to INTEGER NOT NULL, "
    "created_at REAL NOT NULL, body TEXT NOT NULL)"
)
QUEUE_VERSION = 1
INBOUND_FILE = "inbound.db"
OUTBOUND_FILE = "outbound.db"
READ_ATTEMPTS = 50
READ_BACKOFF = 0.002


def _keyed(conn: sqlcipher3.Connection, key: bytes) -> None:
    conn.execute(f"PRAGMA key = \"x'{key.hex()}'\"")
    conn.execute("PRAGMA cipher_memory_security = ON")


class InboundWriter:
    """The host's connection to a session's inbound.db (created on first use)."""

    def __init__(self, directory: Path, key: bytes, agent_gid: int) -> None:
        path = directory / INBOUND_FILE
        self._path = path
        # Sends run in worker threads; one connection's last-insert rowid and the client-id
        # check-then-insert are only meaningful if appends do not interleave.
        self._lock = threading.Lock()
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
            os.fchown(fd, 0, agent_gid)  # the agent (its gid) may read; only root writes
            os.fchmod(fd, 0o640)
            os.close(fd)
            self._db = sqlcipher3.connect(str(path), isolation_level=None, check_same_thread=False)
            _keyed(self._db, key)
            self._db.execute("PRAGMA journal_mode = DELETE")
            self._db.execute("PRAGMA synchronous = FULL")
            if self._db.execute("PRAGMA user_version").fetchone()[0] == 0:
                self._db.executescript(
                    f"BEGIN IMMEDIATE; {INBOUND_SCHEMA}; "
                    f"PRAGMA user_version = {QUEUE_VERSION}; COMMIT;"
                )
        except (OSError, sqlcipher3.Error) as exc:
            raise HostError(f"opening inbound queue {path}: {exc}") from exc

    def append(self, body: str, created_at: float, client_id: str | None) -> tuple[int, bool]:
        """Append a message; return (seq, True) or, for a repeated client id, (old seq, False)."""
        with self._lock:
            try:
                if client_id:
                    row = self._db.execute(
                        "SELECT seq FROM messages WHERE client_id = ?", (client_id,)
                    ).fetchone()
                    if row is not None:
                        return int(row[0]), False
                # fetchall(): the statement must run to completion, which is what commits it
                # (autocommit), before the caller announces the seq.
                rows = self._db.execute(
                    "INSERT INTO messages (created_at, body, client_id) VALUES (?, ?, ?) "
                    "RETURNING seq",
                    (created_at, body, client_id or None),
                ).fetchall()
            except sqlcipher3.Error as exc:
                raise HostError(f"appending to {self._path}: {exc}") from exc
        return int(rows[0][0]), True

    def last_seq(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM messages").fetchone()
        return int(row[0])

    def body(self, seq: int) -> str:
        with self._lock:
            row = self._db.execute("SELECT body FROM messages WHERE seq = ?", (seq,)).fetchone()
        if row is None:
            raise InvalidArgument(f"inbound message {seq} does not exist")
        return str(row[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


class OutboundReader:
    """Reads the agent's outbound.db, read-only, re-opened for every read (no cached pages
    survive between reads: the file changes under us from the other side)."""

    def __init__(self, directory: Path, key: bytes, agent_uid: int) -> None:
        self._path = directory / OUTBOUND_FILE
        self._key = key
        self._agent_uid = agent_uid

    def exists(self) -> bool:
        return self._path.exists()

    def read_after(self, after: int, up_to: int | None = None) -> list[tuple[int, int, float, str]]:
        """Rows with seq > after (and <= up_to), retrying through torn reads and hot journals.
        Rows must be contiguous from after+1; with up_to, all of them must be there."""
        last_error: Exception | None = None
        for _attempt in range(READ_ATTEMPTS):
            try:
                rows = self._read(after, up_to)
            except (sqlcipher3.Error, OSError) as exc:
                last_error = exc
            else:
                expected = list(range(after + 1, after + 1 + len(rows)))
                complete = up_to is None or (rows and rows[-1][0] == up_to)
                if [r[0] for r in rows] == expected and (complete or up_to == after):
                    return rows
                last_error = HostError(f"announced up to {up_to}, read {[r[0] for r in rows]}")
            time.sleep(READ_BACKOFF)
        raise HostError(f"reading {self._path}: gave up after {READ_ATTEMPTS} tries: {last_error}")

    def read_range(self, first: int, last: int) -> list[tuple[int, int, float, str]]:
        """Rows first..last as they are in the file now (for verifying ingested history)."""
        return self._read(first - 1, last)

    def _read(self, after: int, up_to: int | None) -> list[tuple[int, int, float, str]]:
        st = os.lstat(self._path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != self._agent_uid:
            raise HostError(
                f"refusing {self._path}: expected a regular file owned by uid {self._agent_uid}"
            )
        uri = f"file:{self._path}?mode=ro"
        conn = sqlcipher3.connect(uri, uri=True, isolation_level=None)
        try:
            _keyed(conn, self._key)
            conn.execute("PRAGMA trusted_schema = OFF")
            conn.execute("PRAGMA cell_size_check = ON")
            conn.execute("PRAGMA mmap_size = 0")
            schema = conn.execute(
                "SELECT group_concat(sql, ';') FROM sqlite_master WHERE sql IS NOT NULL"
            ).fetchone()[0]
            if schema != OUTBOUND_SCHEMA:
                raise HostError(f"refusing {self._path}: unexpected schema {str(schema)[:120]!r}")
            limit = up_to if up_to is not None else 2**62
            rows = conn.execute(
                "SELECT seq, in_reply_to, created_at, body FROM messages "
                "WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT 10000",
                (after, limit),
            ).fetchall()
        finally:
            conn.close()
        return [(int(a), int(b), float(c), str(d)) for a, b, c, d in rows]


def prepare_queue_dirs(base: Path, sid: str, uid: int, gid: int) -> tuple[Path, Path]:
    """``<base>/<sid>/inbound`` (root-owned, the agent's group may read) and
    ``<base>/<sid>/outbound`` (owned by the agent's uid: gVisor checks host files against it)."""
    session = base / sid
    inbound, outbound = session / "inbound", session / "outbound"
    base.mkdir(mode=0o711, parents=True, exist_ok=True)
    for directory, owner, mode in ((session, (0, 0), 0o711), (inbound, (0, gid), 0o750),
                                   (outbound, (uid, gid), 0o700)):  # fmt: skip
        directory.mkdir(mode=mode, exist_ok=True)
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode):
            raise HostError(f"refusing queue directory {directory}: not a directory")
        os.chown(directory, *owner, follow_symlinks=False)
        os.chmod(directory, mode, follow_symlinks=False)
    return inbound, outbound


def remove_queue_dirs(base: Path, sid: str) -> None:
    session = base / sid
    if session.is_symlink():
        session.unlink()
        return
    if not session.exists():
        return
    for directory, _dirs, files in os.walk(session, topdown=False):
        for name in files:
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)
