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
import os
import secrets
import stat
import time
from collections.abc import Iterable
from pathlib import Path

import sqlcipher3

from ironclawd.errors import Changing, HostError
from ironclawd.store import fdwalk
from ironclawd.store.translate import translated

OUTBOUND_FILE = "outbound.db"
JOURNAL_FILE = OUTBOUND_FILE + "-journal"
OUTBOUND_SCHEMA = (
    "CREATE TABLE messages (seq INTEGER PRIMARY KEY, in_reply_to INTEGER NOT NULL, "
    "created_at REAL NOT NULL, body TEXT NOT NULL)"
)
READ_ATTEMPTS = 50
READ_BACKOFF = 0.002
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


def _private_copy(dir_fd: int, agent_uid: int, max_bytes: int, dest: Path) -> bool:
    """Copy outbound.db (see the module doc) over ``dest``; False if there is no file yet."""
    if _committing(dir_fd):
        raise Changing("the agent is committing (its journal is not empty)")
    try:
        path_fd = os.open(OUTBOUND_FILE, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    except OSError as exc:  # ELOOP: a symlink
        raise HostError(f"refusing {OUTBOUND_FILE}: {exc.strerror or exc}") from exc
    try:
        before = os.fstat(path_fd)
        _check_file(before, agent_uid, max_bytes)
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
    return True


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

    def read_after(self, after: int, limit: int, max_body: int) -> list[RawRow]:
        """Up to ``limit`` rows with seq > after, in seq order, from one consistent copy."""
        with translated(f"reading {self._dir / OUTBOUND_FILE}"):
            if not self._refresh():
                return []
            return self._select(after, 2**62, limit=limit, max_body=max_body)

    def read_range(self, first: int, last: int, max_body: int) -> list[RawRow]:
        """Rows first..last as they are in the file now (for verifying ingested history), on a
        fresh connection: SQLite trusts its cache until page 1 changes, and an agent editing
        pages by hand need not change page 1."""
        with translated(f"reading {self._dir / OUTBOUND_FILE}"):
            if not self._refresh():
                raise HostError(f"{self._dir / OUTBOUND_FILE} does not exist")
            self._drop_connection()
            return self._select(first - 1, last, limit=last - first + 1, max_body=max_body)

    def close(self) -> None:
        """Drop the connection and the copy (a later read makes them again). Files SQLite may
        have put beside the copy go too (a file claiming WAL mode makes it open a -shm)."""
        self._drop_connection()
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
                    found = _private_copy(dir_fd, self._agent_uid, self._max_bytes,
                                          self._copy_path)  # fmt: skip
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
                if not found:
                    self.close()
                return found
            self.close()
            raise HostError(
                f"reading {self._dir / OUTBOUND_FILE}: no quiet moment in {READ_ATTEMPTS} tries:"
                f" {last}"
            )
        finally:
            os.close(dir_fd)

    def _select(self, after: int, up_to: int, *, limit: int, max_body: int) -> list[RawRow]:
        """Rows from the copy. A kept connection that fails is dropped and the read tried once
        on a fresh one: an agent that made its file anew gave it a new salt, which a keyed
        connection does not take up."""
        if self._conn is not None:
            try:
                return _select(self._conn, after, up_to, limit=limit, max_body=max_body)
            except HostError:
                self._drop_connection()
        return _select(self._connect(), after, up_to, limit=limit, max_body=max_body)

    def _connect(self) -> sqlcipher3.Connection:
        try:
            conn = sqlcipher3.connect(f"file:{self._copy_path}?mode=ro", uri=True,
                                      isolation_level=None, check_same_thread=False)  # fmt: skip
        except sqlcipher3.Error as exc:
            raise HostError(f"opening a copy of {OUTBOUND_FILE}: {exc}") from exc
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


def ensure_scratch(scratch: Path) -> None:
    """The daemon's root-only directory for private copies (refused if anyone else could
    reach into it)."""
    with translated(f"preparing scratch directory {scratch}"):
        scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(scratch)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o077:
        raise HostError(f"refusing scratch directory {scratch}: expected root's, mode 0700")


def _select(
    conn: sqlcipher3.Connection, after: int, up_to: int, *, limit: int, max_body: int
) -> list[RawRow]:
    try:
        # fetchall(): a statement left unfinished would hold its read transaction open.
        schema = conn.execute(
            "SELECT group_concat(sql, ';') FROM sqlite_master WHERE sql IS NOT NULL"
        ).fetchall()[0][0]
        if schema != OUTBOUND_SCHEMA:
            raise HostError(f"refusing {OUTBOUND_FILE}: unexpected schema {str(schema)[:120]!r}")
        # SQLite types are advisory: wrong types come back as NULL, and a body is fetched
        # only when it is text within the cap (its length is known without converting it).
        rows = conn.execute(
            "SELECT seq, CASE typeof(in_reply_to) WHEN 'integer' THEN in_reply_to END, "
            "CASE WHEN typeof(created_at) IN ('real', 'integer') THEN created_at END, "
            "CASE WHEN typeof(body) = 'text' AND octet_length(body) <= ? "
            "THEN CAST(body AS BLOB) END "
            "FROM messages WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
            (max_body, after, up_to, limit),
        ).fetchall()
    except sqlcipher3.Error as exc:
        raise HostError(f"reading a copy of {OUTBOUND_FILE}: {exc}") from exc
    return [(int(seq), irt, at, body) for seq, irt, at, body in rows]


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
            conn.execute("PRAGMA user_version = 1")
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
