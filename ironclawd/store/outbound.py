"""Reading the agent's outbound.db with no trust in any path the agent can change.

The outbound directory belongs to the agent (uid 10000), which can rename, link or replace
anything in it at any moment. So the daemon (root) never hands SQLite a path there:

1. the directory is opened ``O_DIRECTORY|O_NOFOLLOW`` and checked on the descriptor (a directory
   owned by the agent uid: the session's tmpfs, store/quota_mount.py);
2. ``outbound.db`` is opened ``O_PATH|O_NOFOLLOW`` relative to that descriptor, so nothing is
   opened at all yet: a symlink fails with ELOOP, and a FIFO or device node is refused by
   ``fstat`` before it is ever opened for reading; only a regular file owned by the agent uid
   with one link and at most the quota's size is then re-opened (through its descriptor,
   ``O_RDONLY|O_NONBLOCK``);
3. that descriptor is copied (``sendfile``, in the kernel) into a root-only directory of the
   daemon's (the file is SQLCipher: no plaintext lands), and SQLite opens the private copy
   read-only. (A memfd does not do: SQLite canonicalises ``/proc/self/fd/N`` through readlink
   to ``/memfd:… (deleted)``.)

For ingestion a reader keeps its copy and one keyed connection to it between reads (opening and
keying one cost more than the rest of a read together): each read overwrites the copy in place,
and SQLite, seeing page 1 changed (every commit changes it) at the start of its next read
transaction, drops what it had cached. Only this daemon writes the copy, never during a read;
the schema is checked on every read. Verification reads on a fresh connection (see read_range).

File locks do not cross the gVisor boundary, so a copy can catch the agent mid-commit. The
agent's rollback journal holds content for the whole of a commit (it keeps the file and
truncates it when the commit ends: journal_mode=TRUNCATE) and every page write changes the
file's mtime: a copy is kept only if no non-empty ``-journal`` existed before or after it and
size, mtime and ctime did not change meanwhile; otherwise it is taken again (bounded).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import secrets
import stat
import time
from collections.abc import Iterable
from pathlib import Path

import sqlcipher3

from ironclawd.errors import Changing, Crafted, HostError
from ironclawd.store import fdwalk
from ironclawd.store.translate import translated

OUTBOUND_FILE = "outbound.db"
JOURNAL_FILE = OUTBOUND_FILE + "-journal"
OUTBOUND_SCHEMA = (
    "CREATE TABLE messages (seq INTEGER PRIMARY KEY, in_reply_to INTEGER NOT NULL, "
    "created_at REAL NOT NULL, body TEXT NOT NULL)"
)
# The agent's queue format (agent/queues.py QUEUE_VERSION, its user_version): a file of another
# version (an agent of another ironclawd version, adopted or restarted) is refused, not misread.
OUTBOUND_VERSION = 1
READ_ATTEMPTS = 50
READ_BACKOFF = 0.002
# Every read of a copy is interrupted once it has used this much of its thread's CPU (SQLite's
# progress handler): the file is the agent's, and a crafted one (a schema table whose pages all
# point at one another) kept a core busy for ever, in a thread nothing could stop, charged to
# the daemon (found by a review). CPU, not wall time: a busy machine must not fail honest reads
# (one of 1000 rows of a 64 MiB file takes tens of ms). After such a read the reader rests,
# longer each time (REST_SECONDS doubled, to REST_MAX_SECONDS), and never reads that same file
# again: a box sending it over and over costs the daemon at most one CPU budget per rest.
QUERY_CPU_SECONDS = 2.0
PROGRESS_STEPS = 10_000  # VM steps between two looks at the clock (~1 ms here)
REST_SECONDS = 2.0
REST_MAX_SECONDS = 60.0
RACY_SECONDS = 0.05  # well over a kernel tick: file times this close to a copy may lag a write
# One read of new rows stops once it holds this many bytes of bodies (at least one row): each
# read's rows go to the state DB in one transaction, under the lock every write of it takes,
# every other session's included. Measured ingesting 48 MiB through the real services: 8 MiB
# held the lock ~90-105 ms a batch, 2 MiB ~21-25 ms, at the same throughput (~42-51 MiB/s).
BATCH_BYTES = 2 * 1024 * 1024
SETID = stat.S_ISUID | stat.S_ISGID

# A row as read: seq, then in_reply_to, created_at and the body's UTF-8 bytes exactly as SQLite
# holds them (None where the value has the wrong type or the body is over the cap).
RawRow = tuple[int, object, object, bytes | None]


def open_outbound_dir(directory: Path, agent_uid: int) -> int:
    """A descriptor of the session's outbound directory, checked to be the agent's directory."""
    try:
        fd = fdwalk.open_dir(directory)
    except OSError as exc:
        raise HostError(f"opening {directory}: {exc.strerror or exc}") from exc
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != agent_uid:
        os.close(fd)
        raise HostError(f"refusing {directory}: expected a directory owned by uid {agent_uid}")
    return fd


def _private_copy(
    dir_fd: int, agent_uid: int, max_bytes: int, dest: Path, unchanged: tuple[int, ...] | None
) -> tuple[tuple[int, ...], bool] | None:
    """Copy outbound.db (see the module doc) over ``dest``; the fingerprint of the file copied
    and whether a later read may trust it, or None if there is no file yet. A file whose
    fingerprint is ``unchanged`` (that of the copy already at ``dest``) is not copied again:
    an agent announcing rows it never wrote, 50 times a second, cost the daemon a copy of up
    to 64 MiB each time (found by a review). Where file times move once a tick (kernels before
    6.13), a write in the tick of the copy keeps them: a copy taken within ``RACY_SECONDS`` of
    the file's last change is not trusted (as git treats a "racily clean" index)."""
    if _committing(dir_fd):
        raise Changing("the agent is committing (its journal is not empty)")
    try:
        path_fd = os.open(OUTBOUND_FILE, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink
        raise HostError(f"refusing {OUTBOUND_FILE}: {exc.strerror or exc}") from exc
    try:
        before = os.fstat(path_fd)
        _check_file(before, agent_uid, max_bytes)
        if unchanged is not None and _fingerprint(before) == unchanged:
            return unchanged, True  # a write moves mtime and ctime, and ctime cannot be set back
        # Re-opening through the descriptor names this inode, whatever the name now points at.
        src = os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(path_fd)
    try:
        opened = os.fstat(src)
        if (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino):
            raise HostError(f"refusing {OUTBOUND_FILE}: it changed while it was opened")
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            copied = 0
            # In the kernel (tmpfs to tmpfs): no buffers of ours, ~40% less than read/write in
            # 1 MiB chunks for 10 MiB here. One byte past the cap is enough to refuse.
            while sent := os.sendfile(out, src, None, max_bytes + 1 - copied):
                copied += sent
                if copied > max_bytes:
                    raise HostError(f"refusing {OUTBOUND_FILE}: over {max_bytes} bytes")
            os.ftruncate(out, copied)
        finally:
            os.close(out)
        after = os.fstat(src)
    finally:
        os.close(src)
    if _fingerprint(after) != _fingerprint(before) or copied != before.st_size:
        raise Changing("the agent wrote the file while it was copied")
    if _committing(dir_fd):
        raise Changing("the agent began a commit while the file was copied")
    trusted = time.time() - max(before.st_mtime, before.st_ctime) > RACY_SECONDS
    return _fingerprint(before), trusted


def _check_file(st: os.stat_result, agent_uid: int, max_bytes: int) -> None:
    if not stat.S_ISREG(st.st_mode) or st.st_uid != agent_uid or st.st_nlink != 1:
        raise HostError(
            f"refusing {OUTBOUND_FILE}: expected a regular file owned by uid {agent_uid} "
            "with one link"
        )
    if st.st_size > max_bytes:
        raise HostError(f"refusing {OUTBOUND_FILE}: {st.st_size} bytes, over {max_bytes}")


def _fingerprint(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _committing(dir_fd: int) -> bool:
    """Whether the agent's rollback journal holds a commit: it exists and is not empty."""
    try:
        st = os.stat(JOURNAL_FILE, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return st.st_size > 0 or not stat.S_ISREG(st.st_mode)


class OutboundReader:
    """Reads a session's outbound.db through a private copy, one consistent copy per read. Not
    thread-safe: each session's reads run one at a time in its own lane (services/lanes.py)."""

    def __init__(
        self, directory: Path, key: bytes, agent_uid: int, scratch: Path, max_bytes: int
    ) -> None:
        self._dir = directory
        self._key = key
        self._agent_uid = agent_uid
        self._scratch = scratch
        self._max_bytes = max_bytes
        self._copy_path = scratch / f"outbound-{secrets.token_hex(8)}.db"
        self._conn: sqlcipher3.Connection | None = None
        self._copied: tuple[int, ...] | None = None  # the fingerprint of the file copied
        self._trusted = False  # whether that fingerprint may stand for the file next time
        self._deadline = 0.0  # thread CPU time past which a statement is interrupted
        self._refused: tuple[int, ...] | None = None  # a file that used up a read's budget
        # Bytes of bodies read from the current copy over all its reads, each row counted once
        # (``_counted`` is the highest seq counted): a read again of the same rows (after a
        # record that failed, or by ``verify``) is not more bytes.
        self._taken = 0
        self._counted = 0
        self._strikes = 0  # such reads in a row
        self._rest_until = 0.0  # monotonic: no read before

    def read_after(self, after: int, limit: int, max_body: int) -> list[RawRow]:
        """Up to ``limit`` rows with seq > after, in seq order, from one consistent copy."""
        with translated(f"reading {self._dir / OUTBOUND_FILE}"):
            self._check_rest()
            if not self._refresh():
                return []
            return self._select(after, 2**62, limit=limit, max_body=max_body, batch=BATCH_BYTES)

    def read_range(self, first: int, last: int, max_body: int) -> list[RawRow]:
        """Rows first..last as they are in the file now (for verifying ingested history), on a
        fresh connection: SQLite trusts its cache until page 1 changes, and an agent editing
        pages by hand need not change page 1."""
        with translated(f"reading {self._dir / OUTBOUND_FILE}"):
            self._check_rest()
            if not self._refresh():
                raise HostError(f"{self._dir / OUTBOUND_FILE} does not exist")
            self._drop_connection()
            return self._select(first - 1, last, limit=last - first + 1, max_body=max_body,
                                batch=2**62)  # fmt: skip

    def close(self) -> None:
        """Drop the connection and the copy (a later read makes them again). Files SQLite may
        have put beside the copy go too (a file claiming WAL mode makes it open a -shm)."""
        self._drop_connection()
        self._copied = None
        for suffix in ("", "-journal", "-wal", "-shm"):
            Path(f"{self._copy_path}{suffix}").unlink(missing_ok=True)

    def _refresh(self) -> bool:
        """Take a consistent copy of the agent's file over ours; False if it has none yet."""
        if self._conn is None:
            ensure_scratch(self._scratch)
        dir_fd = open_outbound_dir(self._dir, self._agent_uid)
        try:
            last: Exception | None = None
            for _attempt in range(READ_ATTEMPTS):
                try:
                    unchanged = self._copied if self._trusted else None
                    found = _private_copy(dir_fd, self._agent_uid, self._max_bytes,
                                          self._copy_path, unchanged)  # fmt: skip
                except Changing as exc:
                    last = exc
                    time.sleep(READ_BACKOFF)
                    continue
                except OSError as exc:
                    self.close()
                    raise HostError(f"reading {self._dir / OUTBOUND_FILE}: {exc}") from exc
                except BaseException:
                    self.close()
                    raise
                if found is None:
                    self.close()
                    return False
                fingerprint, self._trusted = found
                if fingerprint != self._copied:
                    self._taken = self._counted = 0
                self._copied = fingerprint
                return True
            self.close()
            raise HostError(
                f"reading {self._dir / OUTBOUND_FILE}: no quiet moment in {READ_ATTEMPTS} tries:"
                f" {last}"
            )
        finally:
            os.close(dir_fd)

    def _select(
        self, after: int, up_to: int, *, limit: int, max_body: int, batch: int
    ) -> list[RawRow]:
        """Rows from the copy. A kept connection that fails is dropped and the read tried once
        on a fresh one: an agent that made its file anew gave it a new salt, which a keyed
        connection does not take up."""
        copied = self._copied
        assert copied is not None
        if copied == self._refused:
            raise HostError(f"refusing {OUTBOUND_FILE}: unchanged since it was refused")
        # Bodies can never hold more bytes than the file they are stored in, over all the reads
        # of one copy: rows that do share pages (a crafted file made 1000 rows of 1 MiB out of
        # 1.5 MB, fed to the state DB), and the file is refused.
        room = (copied[1] - self._taken, self._counted)
        started = time.thread_time()
        self._deadline = started + QUERY_CPU_SECONDS
        try:
            if self._conn is not None:
                try:
                    return self._selected(_select(self._conn, after, up_to, limit=limit,
                                                  max_body=max_body, size=room,
                                                  batch=batch))  # fmt: skip
                except HostError:
                    self._drop_connection()
            return self._selected(_select(self._connect(), after, up_to, limit=limit,
                                          max_body=max_body, size=room,
                                          batch=batch))  # fmt: skip
        except HostError as exc:
            spent = time.thread_time() - started
            if isinstance(exc, Crafted) or spent >= QUERY_CPU_SECONDS / 2:
                self._rest(copied)
            if spent >= QUERY_CPU_SECONDS and not isinstance(exc, Crafted):
                raise HostError(
                    f"reading a copy of {OUTBOUND_FILE}: stopped after {QUERY_CPU_SECONDS:g} s "
                    f"of CPU, its budget ({exc})"
                ) from exc
            raise

    def _selected(self, rows: list[RawRow]) -> list[RawRow]:
        self._strikes = 0
        fresh = [(seq, body) for seq, _, _, body in rows if seq > self._counted]
        self._taken += sum(len(body) for _, body in fresh if isinstance(body, bytes))
        self._counted = max((seq for seq, _ in fresh), default=self._counted)
        return rows

    def _rest(self, refused: tuple[int, ...]) -> None:
        """A read used up its budget (or found rows sharing pages): never read that file again,
        and read no other for a while, longer each time in a row."""
        self._refused = refused
        self._strikes += 1
        rest = min(REST_MAX_SECONDS, REST_SECONDS * 2 ** (self._strikes - 1))
        self._rest_until = time.monotonic() + rest

    def _check_rest(self) -> None:
        left = self._rest_until - time.monotonic()
        if left > 0:
            raise HostError(
                f"refusing {OUTBOUND_FILE} for {left:.0f} s more: a read of it used up its "
                f"{QUERY_CPU_SECONDS:g} s of CPU or found a crafted file"
            )

    def _interrupted(self) -> bool:
        """SQLite's progress handler: a true answer interrupts the statement running."""
        return time.thread_time() > self._deadline

    def _connect(self) -> sqlcipher3.Connection:
        try:
            conn = sqlcipher3.connect(f"file:{self._copy_path}?mode=ro", uri=True,
                                      isolation_level=None, check_same_thread=False)  # fmt: skip
        except sqlcipher3.Error as exc:
            raise HostError(f"opening a copy of {OUTBOUND_FILE}: {exc}") from exc
        # Before any statement: the first one loads the schema, which the agent wrote.
        conn.set_progress_handler(self._interrupted, PROGRESS_STEPS)
        limit_length(conn, self._copy_path, self._max_bytes + LENGTH_SLACK)
        try:
            conn.execute(f"PRAGMA key = \"x'{self._key.hex()}'\"")
            conn.execute("PRAGMA cipher_memory_security = ON")
            conn.execute("PRAGMA trusted_schema = OFF")
            conn.execute("PRAGMA cell_size_check = ON")
            conn.execute("PRAGMA mmap_size = 0")
            conn.execute("PRAGMA temp_store = MEMORY")
            # Every read finds the file changed and starts from an empty cache: keep it small.
            conn.execute("PRAGMA cache_size = 64")
        except sqlcipher3.Error as exc:
            conn.close()
            raise HostError(f"opening a copy of {OUTBOUND_FILE}: {exc}") from exc
        self._conn = conn
        return conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlcipher3.Error):
                self._conn.close()
            self._conn = None


# SQLite's SQLITE_LIMIT_LENGTH (sqlite3.h): the largest string or blob a connection makes.
_LIMIT_LENGTH = 0
LENGTH_SLACK = 1024 * 1024
# Where pysqlite's Connection keeps its ``sqlite3 *`` (the first field after PyObject_HEAD;
# sqlcipher3 is pysqlite3, whose struct is CPython's _sqlite Connection).
_DB_OFFSET = 2 * ctypes.sizeof(ctypes.c_void_p)


@functools.cache
def _library() -> ctypes.CDLL:
    from sqlcipher3 import _sqlite3  # noqa: PLC0415

    lib = ctypes.CDLL(_sqlite3.__file__)
    lib.sqlite3_limit.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
    lib.sqlite3_limit.restype = ctypes.c_int
    lib.sqlite3_db_filename.argtypes = (ctypes.c_void_p, ctypes.c_char_p)
    lib.sqlite3_db_filename.restype = ctypes.c_char_p
    return lib


def limit_length(conn: sqlcipher3.Connection, path: Path, limit: int) -> None:
    """Cap the strings and blobs ``conn`` makes at ``limit`` bytes (SQLite allows 1 GB). A
    crafted file's schema row claimed 900 MB of SQL on an overflow page pointing at itself:
    SQLite built it in one step, where no progress handler runs (15 s of CPU and 3.4 GiB of
    the daemon's memory; found by a review). A file of the agent's holds at most its quota, so
    nothing honest is longer. sqlcipher3 has no ``setlimit``: the library's own
    ``sqlite3_limit`` is called on the connection's handle, which is checked first to be the
    handle of the file at ``path`` this connection opened (``sqlite3_db_filename``)."""
    lib = _library()
    db = ctypes.c_void_p.from_address(id(conn) + _DB_OFFSET).value
    named = lib.sqlite3_db_filename(db, b"main") if db else None
    if named is None or os.fsdecode(named) != os.path.realpath(path):
        raise HostError(
            "cannot limit SQLite's string length: the connection's handle is not where "
            "pysqlite keeps it (a sqlcipher3 other than the pinned one?)"
        )
    lib.sqlite3_limit(db, _LIMIT_LENGTH, limit)


def ensure_scratch(scratch: Path) -> None:
    """The daemon's root-only directory for private copies (refused if anyone else could
    reach into it)."""
    with translated(f"preparing scratch directory {scratch}"):
        scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(scratch)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o077:
        raise HostError(f"refusing scratch directory {scratch}: expected root's, mode 0700")


def _select(
    conn: sqlcipher3.Connection,
    after: int,
    up_to: int,
    *,
    limit: int,
    max_body: int,
    size: tuple[int, int],
    batch: int,
) -> list[RawRow]:
    """Up to ``limit`` rows after ``after`` (to ``up_to``), stopping once they hold ``batch``
    bytes of bodies (at least one row); Crafted if the rows after seq ``size[1]`` would hold
    more than ``size[0]`` bytes."""
    try:
        # fetchall(): a statement left unfinished would hold its read transaction open.
        schema = conn.execute(
            "SELECT group_concat(sql, ';') FROM sqlite_master WHERE sql IS NOT NULL"
        ).fetchall()[0][0]
        if schema != OUTBOUND_SCHEMA:
            raise HostError(f"refusing {OUTBOUND_FILE}: unexpected schema {str(schema)[:120]!r}")
        version = conn.execute("PRAGMA user_version").fetchall()[0][0]
        if version != OUTBOUND_VERSION:
            raise HostError(
                f"refusing {OUTBOUND_FILE}: format version {version}, this ironclawd reads "
                f"version {OUTBOUND_VERSION} (an agent of another ironclawd version wrote it; "
                "its replies stay in the file)"
            )
        up_to = _batch_end(conn, after, up_to, limit=limit, max_body=max_body, batch=batch)
        # SQLite types are advisory: wrong types come back as NULL, and a body is fetched
        # only when it is text within the cap (its length is known without converting it).
        cursor = conn.execute(
            "SELECT seq, CASE typeof(in_reply_to) WHEN 'integer' THEN in_reply_to END, "
            "CASE WHEN typeof(created_at) IN ('real', 'integer') THEN created_at END, "
            "CASE WHEN typeof(body) = 'text' AND octet_length(body) <= ? "
            "THEN CAST(body AS BLOB) END "
            "FROM messages WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
            (max_body, after, up_to, limit),
        )
        try:
            return _taken(cursor, size, batch)
        finally:
            cursor.close()  # ends the statement, and with it the read transaction
    except sqlcipher3.Error as exc:
        raise HostError(f"reading a copy of {OUTBOUND_FILE}: {exc}") from exc


def _batch_end(
    conn: sqlcipher3.Connection, after: int, up_to: int, *, limit: int, max_body: int, batch: int
) -> int:
    """The seq of the row whose body fills ``batch`` (``up_to`` if none does), from the
    rows' lengths, which SQLite reads off their record headers without their bodies. The
    driver steps one row past the last one taken: without this end, each read also read and
    decrypted the row after its batch for nothing (a third of a 2 MiB batch of 1 MiB replies).
    What the lengths say is only where to stop: ``_taken`` counts the bodies themselves."""
    if batch >= 2**62:
        return up_to
    cursor = conn.execute(
        "SELECT seq, CASE WHEN typeof(body) = 'text' AND octet_length(body) <= ? "
        "THEN octet_length(body) ELSE 0 END "
        "FROM messages WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
        (max_body, after, up_to, limit),
    )
    try:
        held = 0
        for seq, length in cursor:
            held += length
            if held >= batch:
                return int(seq)
        return up_to
    finally:
        cursor.close()


def _taken(cursor: sqlcipher3.Cursor, size: tuple[int, int], batch: int) -> list[RawRow]:
    room, counted = size
    rows: list[RawRow] = []
    held = new = 0
    # One row at a time: fetchmany(64) stepped (and decrypted) up to 64 rows past the one
    # that filled the batch, 64 MiB of 1 MiB bodies read for each batch and thrown away.
    for seq, irt, at, body in cursor:
        length = len(body) if isinstance(body, bytes) else 0
        held += length
        new += length if seq > counted else 0
        if new > room:
            raise Crafted(
                f"refusing {OUTBOUND_FILE}: its rows hold more bytes than the file "
                "(rows sharing pages: a crafted file)"
            )
        rows.append((int(seq), irt, at, body))
        if held >= batch:
            return rows
    return rows


def strip_setid(directory: Path, agent_uid: int, max_entries: int) -> int:
    """Clear setuid/setgid bits on everything under the outbound directory (gVisor's gofer
    creates the agent's files with the modes it asks for), and give back to the agent what is
    not its own; never follows a link and never opens a file for reading (store/fdwalk.py).
    Returns how many entries were changed.

    Not its own: runsc's gofer (host root) creates a file and then chowns it to the agent. A
    sandbox killed between the two leaves a root-owned file, e.g. an empty
    ``outbound.db-journal`` that the next agent cannot open ("unable to open database file" at
    its first reply), so every restart died and the session was wedged."""
    dir_fd = open_outbound_dir(directory, agent_uid)
    owner = (agent_uid, os.fstat(dir_fd).st_gid)
    changed = [0]

    def strip(parent_fd: int, name: str) -> None:
        changed[0] += _strip_one(parent_fd, name, owner)

    try:
        fdwalk.visit(dir_fd, strip, max_entries)
    except OSError as exc:
        raise HostError(f"stripping setid bits under {directory}: {exc}") from exc
    finally:
        os.close(dir_fd)
    return changed[0]


def _strip_one(parent_fd: int, name: str, owner: tuple[int, int]) -> int:
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    except OSError:
        return 0  # gone meanwhile
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            return 0  # O_PATH|O_NOFOLLOW on a symlink names the link itself: never changed
        # Through the O_PATH descriptor's magic link: the inode we checked, by no name. The
        # outbound tmpfs is a file system of its own, so no hard link reaches a host file.
        foreign = st.st_uid != owner[0] and (stat.S_ISDIR(st.st_mode) or st.st_nlink == 1)
        setid = st.st_mode & SETID
        if not (foreign or setid):
            return 0
        if foreign:
            os.chown(f"/proc/self/fd/{fd}", *owner)
        if setid:
            os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) & ~SETID)
    except OSError:
        return 0
    finally:
        os.close(fd)
    return 1


def restore_outbound(
    directory: Path,
    key: bytes,
    owner: tuple[int, int],
    rows: Iterable[tuple[int, int, float, str]],
    scratch: Path,
    *,
    doing: str = "rebuilding from the record",
) -> int:
    """Write outbound.db afresh into an empty outbound directory, before the agent opens it:
    from the host's record after a host reboot emptied its tmpfs (the agent then resumes after
    the last message it answered instead of answering everything again with seqs the host
    skips), or empty when a pooled sandbox is claimed (its agent then only opens it, instead of
    making it through the sandbox's file system). Built in the daemon's own directory, then
    copied in by descriptor; never over a file that is there. Returns how many rows."""
    ensure_scratch(scratch)
    built = scratch / f"restore-{secrets.token_hex(8)}.db"
    count = 0
    try:
        conn = sqlcipher3.connect(str(built), isolation_level=None)
        try:
            conn.execute(f"PRAGMA key = \"x'{key.hex()}'\"")
            # A scratch copy, unlinked whatever happens: what must last is the copy's fsync
            # below. Syncing the build (journal, file, directory) took 1.6 of its 1.8 ms on
            # this machine's ext4, on the path of every pooled create.
            conn.execute("PRAGMA journal_mode = MEMORY")
            conn.execute("PRAGMA synchronous = OFF")
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # as the agent makes it
            conn.execute("BEGIN")
            conn.execute(OUTBOUND_SCHEMA)
            conn.execute(f"PRAGMA user_version = {OUTBOUND_VERSION}")
            for row in rows:
                conn.execute(
                    "INSERT INTO messages (seq, in_reply_to, created_at, body) VALUES (?, ?, ?, ?)",
                    row,
                )
                count += 1
            conn.execute("COMMIT")
        finally:
            conn.close()
        data = built.read_bytes()
    except (OSError, sqlcipher3.Error) as exc:
        raise HostError(f"{doing}: {directory / OUTBOUND_FILE}: {exc}") from exc
    finally:
        built.unlink(missing_ok=True)
    dir_fd = open_outbound_dir(directory, owner[0])
    try:
        fd = os.open(OUTBOUND_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)  # fmt: skip
        try:
            os.fchown(fd, *owner)
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise HostError(
            f"{doing}: writing {directory / OUTBOUND_FILE}: {exc.strerror or exc}"
        ) from exc
    finally:
        os.close(dir_fd)
    return count
