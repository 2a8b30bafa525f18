"""Per-session encrypted queues (docs/architecture.md §4): the host's side.

``inbound.db`` — the host is its only writer; the agent reads it through a read-only mount.
``outbound.db`` — the agent is its only writer; the host reads it read-only and *ingests* rows
into the state DB, which is the record.

Both are SQLCipher 4 with the session's raw 256-bit key and a rollback journal (WAL's shared
memory does not cross the gVisor boundary). inbound.db, on the state disk: journal DELETE,
synchronous=FULL. outbound.db, on the session's tmpfs: journal TRUNCATE (kept, empty between
commits), synchronous=OFF (agent/queues.py says why). File locks taken in the sandbox are not
seen by the host, so nothing relies on them: each file has one writer, commits are announced on
the control socket, and a reader that meets a hot journal or a half-written page gets an error
and retries (docs/development.md, "SQLite / SQLCipher").

The outbound file is written by an untrusted agent: store/outbound.py reads it without trusting
any path (descriptors only, a private copy for SQLite).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import sqlcipher3

from ironclawd.errors import HostError
from ironclawd.store.fdwalk import remove_tree
from ironclawd.store.quota_mount import OutboundQuota, mount_outbound, unmount_outbound
from ironclawd.store.translate import translated

INBOUND_SCHEMA = (
    "CREATE TABLE messages (seq INTEGER PRIMARY KEY, created_at REAL NOT NULL, "
    "body TEXT NOT NULL, client_id TEXT UNIQUE)"
)
QUEUE_VERSION = 1
INBOUND_FILE = "inbound.db"


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
        with translated(f"opening inbound queue {path}"):
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
            os.fchown(fd, 0, agent_gid)  # the agent (its gid) may read; only root writes
            os.fchmod(fd, 0o640)
            os.close(fd)
            self._db = sqlcipher3.connect(str(path), isolation_level=None, check_same_thread=False)
            _keyed(self._db, key)
            self._db.execute("PRAGMA journal_mode = DELETE")
            self._db.execute("PRAGMA synchronous = FULL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                self._db.executescript(
                    f"BEGIN IMMEDIATE; {INBOUND_SCHEMA}; "
                    f"PRAGMA user_version = {QUEUE_VERSION}; COMMIT;"
                )
            elif version != QUEUE_VERSION:
                # Another version's file (a downgrade, or a session left by a newer daemon):
                # appending in this version's format would feed its agent rows it misreads.
                self._db.close()
                raise HostError(
                    f"refusing inbound queue {path}: format version {version}, this ironclawd "
                    f"writes version {QUEUE_VERSION} (made by another ironclawd version)"
                )

    def append(self, body: str, created_at: float, client_id: str | None) -> tuple[int, bool]:
        """Append a message; return (seq, True) or, for a repeated client id, (old seq, False)."""
        with self._op("appending to"):
            if client_id:
                row = self._db.execute(
                    "SELECT seq FROM messages WHERE client_id = ?", (client_id,)
                ).fetchone()
                if row is not None:
                    return int(row[0]), False
            # fetchall(): the statement must run to completion, which is what commits it
            # (autocommit), before the caller announces the seq.
            rows = self._db.execute(
                "INSERT INTO messages (created_at, body, client_id) VALUES (?, ?, ?) RETURNING seq",
                (created_at, body, client_id or None),
            ).fetchall()
        return int(rows[0][0]), True

    def last_seq(self) -> int:
        with self._op("reading the last seq of"):
            row = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM messages").fetchone()
        return int(row[0])

    def close(self) -> None:
        with self._op("closing"):
            self._db.close()

    @contextlib.contextmanager
    def _op(self, doing: str) -> Iterator[None]:
        """One operation on the queue: under the lock, driver errors translated naming it."""
        with self._lock, translated(f"{doing} {self._path}", self._db):
            yield


def prepare_queue_dirs(
    base: Path, sid: str, uid: int, gid: int, quota: OutboundQuota | None = None
) -> tuple[Path, Path]:
    """``<base>/<sid>/inbound`` (root-owned, the agent's group may read) and
    ``<base>/<sid>/outbound`` (owned by the agent's uid: gVisor checks host files against it).
    With ``quota``, the outbound directory is a tmpfs of that size and inode count (mounted
    once, kept until the session is removed): the box meets ENOSPC, the host disk nothing."""
    with translated(f"preparing the queue directories of session {sid} under {base}"):
        session = base / sid
        inbound, outbound = session / "inbound", session / "outbound"
        base.mkdir(mode=0o711, parents=True, exist_ok=True)
        for directory, owner, mode in ((session, (0, 0), 0o711), (inbound, (0, gid), 0o750),
                                       (outbound, (uid, gid), 0o700)):  # fmt: skip
            directory.mkdir(mode=mode, exist_ok=True)
            st = os.lstat(directory)
            if not stat.S_ISDIR(st.st_mode):
                raise HostError(f"refusing queue directory {directory}: not a directory")
            if directory is outbound and quota is not None:
                mount_outbound(outbound, uid, gid, quota)
            os.chown(directory, *owner, follow_symlinks=False)
            os.chmod(directory, mode, follow_symlinks=False)
        return inbound, outbound


def remove_queue_dirs(base: Path, sid: str) -> None:
    """Remove a session's queue files: the outbound tmpfs is unmounted first, then everything
    is removed through directory descriptors, never following a link the box planted."""
    with translated(f"removing the queue directories of session {sid} under {base}"):
        session = base / sid
        if session.is_symlink():
            session.unlink()
            return
        if not session.exists():
            return
        unmount_outbound(session / "outbound")
        remove_tree(session)
