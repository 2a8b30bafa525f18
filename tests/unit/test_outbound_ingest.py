"""Issue 10, second escape: reading the agent's outbound.db with no path trust, hostile rows,
setid bits, removal that never follows a link, and per-session lanes. Real files and real
SQLCipher; the agent's uid is the test's own (the unit tier may not chown)."""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import threading
from pathlib import Path

import pytest
import sqlcipher3

from agent.queues import Outbound as AgentOutbound
from ironclawd.config import parse_config
from ironclawd.domain.messages import QueueLimits, accept_row, chain_link
from ironclawd.errors import ConfigError, HostError
from ironclawd.services.lanes import Lanes
from ironclawd.store import fdwalk, outbound
from ironclawd.store.fdwalk import remove_tree
from ironclawd.store.outbound import (
    OUTBOUND_SCHEMA,
    OutboundReader,
    restore_outbound,
    strip_setid,
)
from ironclawd.store.queues import remove_queue_dirs

KEY = bytes(range(32))
SQLITE_HEADER = b"SQLite format 3"
UID = os.getuid()
CAP = 1024


@pytest.fixture
def outdir(tmp_path: Path) -> Path:
    d = tmp_path / "queues" / "s1" / "outbound"
    d.mkdir(parents=True, mode=0o700)
    return d


def reader(outdir: Path, max_bytes: int = 1 << 20) -> OutboundReader:
    return OutboundReader(outdir, KEY, UID, outdir.parents[2] / "scratch", max_bytes)


def write_db(path: Path, rows: list[tuple[object, object, object]]) -> None:
    conn = sqlcipher3.connect(str(path), isolation_level=None)
    conn.execute(f"PRAGMA key = \"x'{KEY.hex()}'\"")
    conn.execute("PRAGMA journal_mode = DELETE")
    if conn.execute("PRAGMA user_version").fetchone()[0] == 0:
        conn.executescript(f"BEGIN; {OUTBOUND_SCHEMA}; PRAGMA user_version = 1; COMMIT;")
    conn.execute("BEGIN")
    for in_reply_to, created_at, body in rows:
        conn.execute(
            "INSERT INTO messages (in_reply_to, created_at, body) VALUES (?, ?, ?)",
            (in_reply_to, created_at, body),
        )
    conn.execute("COMMIT")
    conn.close()


# -- hostile rows become placeholders (pure) ----------------------------------------------------


@pytest.mark.parametrize(
    ("in_reply_to", "created_at", "body", "problem"),
    [
        (-1, 1.0, b"x", "in_reply_to -1 is out of range"),
        (None, 1.0, b"x", "in_reply_to is not an integer"),
        (1, float("nan"), b"x", "created_at is not a finite time"),
        (1, None, b"x", "created_at is not a number"),
        (1, 1.0, b"\xff\xfe", "body is not valid UTF-8"),
        (1, 1.0, None, f"body is not text of at most {CAP} bytes"),
        (1, 1.0, b"x" * (CAP + 1), f"body is not text of at most {CAP} bytes"),
    ],
)
def test_a_hostile_row_becomes_a_placeholder_that_chains(
    in_reply_to: object, created_at: object, body: object, problem: str
) -> None:
    row, why = accept_row(7, in_reply_to, created_at, body, CAP)
    assert why == problem
    assert row == (7, 0, 0.0, f"[ironclawd refused reply 7: {problem}]")
    chain_link(b"\0" * 32, *row)  # the placeholder always chains (a negative value did not)
    assert accept_row(7, in_reply_to, created_at, body, CAP) == (row, why)  # verify agrees


def test_a_good_row_is_taken_as_it_is() -> None:
    assert accept_row(3, 2, 5.5, "héllo".encode(), CAP) == ((3, 2, 5.5, "héllo"), "")


# -- the reader: descriptors only, a private copy ----------------------------------------------


def test_rows_come_back_raw_and_hostile_ones_typed_as_none(outdir: Path) -> None:
    write_db(outdir / "outbound.db", [(1, 1.0, "ok"), (-5, 2.0, "neg"), (2, 3.0, b"\xff"),
                                      (3, 4.0, "y" * (CAP + 1)), (4, 5.0, "after")])  # fmt: skip
    kept = reader(outdir)
    rows = kept.read_after(0, 100, CAP)
    assert rows == [(1, 1, 1.0, b"ok"), (2, -5, 2.0, b"neg"), (3, 2, 3.0, None),
                    (4, 3, 4.0, None), (5, 4, 5.0, b"after")]  # fmt: skip
    accepted = [accept_row(*r, CAP) for r in rows]
    assert [why != "" for _row, why in accepted] == [False, True, True, True, False]
    assert accepted[-1][0] == (5, 4, 5.0, "after")  # good rows after bad ones still flow
    scratch = outdir.parents[2] / "scratch"
    (copy,) = scratch.iterdir()  # kept for the next read: root's, encrypted like the original
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert SQLITE_HEADER not in copy.read_bytes()[:16]
    kept.close()
    assert not list(scratch.iterdir())  # the copy is gone


def test_twenty_thousand_rows_arrive_in_batches(outdir: Path) -> None:
    write_db(outdir / "outbound.db", [(i, float(i), f"r{i}") for i in range(20_000)])
    r, after, got = reader(outdir), 0, 0
    while batch := r.read_after(after, 1000, CAP):
        assert [row[0] for row in batch] == list(range(after + 1, after + 1 + len(batch)))
        after, got = batch[-1][0], got + len(batch)
    assert got == 20_000


def test_a_kept_reader_sees_each_commit_and_a_file_made_anew(outdir: Path) -> None:
    db = outdir / "outbound.db"
    kept = reader(outdir)
    assert kept.read_after(0, 10, CAP) == []
    for n in range(1, 40):  # each read comes after a commit of the agent's
        write_db(db, [(n, float(n), f"r{n}")])
        assert [row[0] for row in kept.read_after(n - 1, 10, CAP)] == [n]
    assert [row[3] for row in kept.read_after(0, 100, CAP)] == [
        f"r{n}".encode() for n in range(1, 40)
    ]
    db.unlink()  # the agent starts over: a new file, a new salt
    write_db(db, [(7, 7.0, "new file")])
    assert kept.read_after(0, 10, CAP) == [(1, 7, 7.0, b"new file")]
    assert kept.read_range(1, 1, CAP) == [(1, 7, 7.0, b"new file")]
    db.unlink()
    assert kept.read_after(0, 10, CAP) == []  # gone again: nothing, and nothing kept
    assert not list((outdir.parents[2] / "scratch").iterdir())


def test_no_file_yet_reads_nothing(outdir: Path) -> None:
    assert reader(outdir).read_after(0, 10, CAP) == []


def fifo_reader_count(fifo: Path) -> bool:
    """Whether anything holds the FIFO open for reading (the write end opens only then)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno != errno.ENXIO:
            raise
        return False
    os.close(fd)
    return True


@pytest.mark.parametrize("target", ["fifo", "devzero", "hostfile"])
def test_a_symlinked_outbound_db_is_refused_without_opening_its_target(
    outdir: Path, tmp_path: Path, target: str
) -> None:
    fifo = tmp_path / "host.fifo"
    os.mkfifo(fifo)
    host = tmp_path / "host.db"
    write_db(host, [(1, 1.0, "host secret")])
    dest = {"fifo": fifo, "devzero": Path("/dev/zero"), "hostfile": host}[target]
    (outdir / "outbound.db").symlink_to(dest)
    stop = threading.Event()
    seen: list[bool] = []

    def watch() -> None:
        while not stop.is_set():
            seen.append(fifo_reader_count(fifo))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pytest.raises(HostError, match=r"refusing outbound\.db"):
            reader(outdir).read_after(0, 10, CAP)
    finally:
        stop.set()
        watcher.join()
    assert not any(seen)


class _ForeignStat:
    """A regular file's ``fstat`` as if another uid owned it (the unit tier may not chown)."""

    def __init__(self, st: os.stat_result) -> None:
        self._st = st
        self.st_uid = UID + 1

    def __getattr__(self, name: str) -> object:
        return getattr(self._st, name)


@pytest.mark.parametrize(
    ("kind", "match"),
    [
        ("fifo", f"refusing outbound.db: expected a regular file owned by uid {UID} with one link"),
        ("hardlink", "refusing outbound.db: expected a regular file owned by uid"),
        ("owner", "refusing outbound.db: expected a regular file owned by uid"),
        ("size", "refusing outbound.db: [0-9]+ bytes, over 1024"),
    ],
    ids=["fifo", "hardlink", "owner", "size"],
)
def test_anything_but_a_lone_regular_agent_file_is_refused(
    outdir: Path, kind: str, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = outdir / "outbound.db"
    if kind == "fifo":
        os.mkfifo(db)
    else:
        write_db(db, [(1, 1.0, "x")])
    if kind == "hardlink":
        os.link(db, outdir / "other")
    r = reader(outdir, max_bytes=1024 if kind == "size" else 1 << 20)
    if kind == "owner":
        # The directory stays the agent's (a foreign one is refused before the file is looked
        # at); only the file is another uid's.
        real_fstat = os.fstat

        def fstat(fd: int) -> object:
            st = real_fstat(fd)
            return _ForeignStat(st) if stat.S_ISREG(st.st_mode) else st

        monkeypatch.setattr(os, "fstat", fstat)
    with pytest.raises(HostError, match=match):
        r.read_after(0, 10, CAP)


def test_a_commit_in_progress_is_waited_out(outdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_db(outdir / "outbound.db", [(1, 1.0, "x")])
    journal = outdir / "outbound.db-journal"
    journal.write_bytes(b"hot")
    monkeypatch.setattr(outbound, "READ_BACKOFF", 0)
    with pytest.raises(HostError, match="no quiet moment"):
        reader(outdir).read_after(0, 10, CAP)
    calls = []
    real = outbound._committing

    def journal_goes_away(dir_fd: int) -> bool:
        calls.append(dir_fd)
        if len(calls) == 3:
            journal.unlink()
        return real(dir_fd)

    monkeypatch.setattr(outbound, "_committing", journal_goes_away)
    assert [row[0] for row in reader(outdir).read_after(0, 10, CAP)] == [1]


@pytest.mark.parametrize("kind", ["truncated", "non-empty", "directory"])
def test_an_empty_journal_is_a_finished_commit(
    outdir: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The agent keeps its journal between commits (journal_mode=TRUNCATE): an empty one
    means no commit is under way; one with content, or anything but a file, means wait."""
    write_db(outdir / "outbound.db", [(1, 1.0, "x")])
    journal = outdir / "outbound.db-journal"
    if kind == "directory":
        journal.mkdir()
    else:
        journal.write_bytes(b"" if kind == "truncated" else b"\xd9\xd5\x05\xf9")
    monkeypatch.setattr(outbound, "READ_BACKOFF", 0)
    if kind == "truncated":
        assert [row[0] for row in reader(outdir).read_after(0, 10, CAP)] == [1]
    else:
        with pytest.raises(HostError, match="no quiet moment"):
            reader(outdir).read_after(0, 10, CAP)


def test_the_agents_outbound_is_read_commit_by_commit(
    outdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's own writer (agent/queues.py: a kept journal, no fsync on its tmpfs) against
    the host's kept reader: every commit is seen, the journal is empty between commits, and a
    copy is not taken while one is under way."""
    agent_side = AgentOutbound(outdir / "outbound.db", KEY)
    host_side = reader(outdir)
    for n in range(1, 20):
        assert agent_side.append(n, f"reply {n}") == n
        assert (outdir / "outbound.db-journal").stat().st_size == 0
        rows = host_side.read_after(n - 1, n, CAP)
        assert [(row[0], row[3]) for row in rows] == [(n, f"reply {n}".encode())]
    monkeypatch.setattr(outbound, "READ_BACKOFF", 0)
    db = agent_side._db
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO messages (in_reply_to, created_at, body) VALUES (20, 1.0, 'x')")
    db.execute("DELETE FROM messages WHERE seq < 10")  # pages of the file change before COMMIT
    assert (outdir / "outbound.db-journal").stat().st_size > 0
    with pytest.raises(HostError, match="no quiet moment"):
        reader(outdir).read_after(0, 30, CAP)
    db.execute("COMMIT")
    assert [row[0] for row in reader(outdir).read_after(0, 30, CAP)] == [*range(10, 21)]


def test_a_write_during_the_copy_is_detected(outdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = outdir / "outbound.db"
    write_db(db, [(1, 1.0, "x")])
    real_sendfile = os.sendfile
    writes: list[int] = []

    def copy_then_agent_writes(out: int, src: int, offset: int | None, count: int) -> int:
        sent = real_sendfile(out, src, offset, count)
        if not writes:
            writes.append(1)
            write_db(db, [(2, 2.0, "y")])  # the agent commits mid-copy
        return sent

    monkeypatch.setattr(os, "sendfile", copy_then_agent_writes)
    rows = reader(outdir).read_after(0, 10, CAP)
    assert [row[0] for row in rows] == [1, 2]  # the torn copy was taken again


def test_a_file_that_grows_past_the_cap_during_the_copy_is_refused(
    outdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = outdir / "outbound.db"
    write_db(db, [(1, 1.0, "x")])
    cap = db.stat().st_size + 100  # within the cap when checked, over it once grown
    real_sendfile = os.sendfile
    copied: list[int] = []

    def copy_then_agent_grows(out: int, src: int, offset: int | None, count: int) -> int:
        copied.append(count)
        if len(copied) == 1:
            with db.open("ab") as grow:
                grow.write(b"\0" * 4096)
        return real_sendfile(out, src, offset, count)

    monkeypatch.setattr(os, "sendfile", copy_then_agent_grows)
    with pytest.raises(HostError, match=f"over {cap} bytes"):
        reader(outdir, max_bytes=cap).read_after(0, 10, CAP)
    assert copied[0] == cap + 1  # never asked for more than one byte past the cap


def test_a_symlinked_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    link = tmp_path / "outbound"
    link.symlink_to(real)
    with pytest.raises(HostError, match="opening"):
        OutboundReader(link, KEY, UID, tmp_path / "scratch", 1 << 20).read_after(0, 1, CAP)


# -- setid bits and removal --------------------------------------------------------------------


def test_setid_bits_are_stripped_and_links_never_followed(outdir: Path, tmp_path: Path) -> None:
    host = tmp_path / "host-suid"
    host.write_bytes(b"x")
    os.chmod(host, 0o4755)
    (outdir / "sub").mkdir()
    for path, mode in ((outdir / "a", 0o6755), (outdir / "sub" / "b", 0o4700)):
        path.write_bytes(b"x")
        os.chmod(path, mode)
    os.chmod(outdir / "sub", 0o2770)
    (outdir / "link").symlink_to(host)
    assert strip_setid(outdir, UID, 100) == 3
    for path in (outdir / "a", outdir / "sub" / "b", outdir / "sub"):
        assert not os.lstat(path).st_mode & (stat.S_ISUID | stat.S_ISGID), path
    assert stat.S_IMODE(os.lstat(outdir / "a").st_mode) == 0o755
    assert stat.S_IMODE(host.stat().st_mode) == 0o4755  # the link's target is untouched


def test_session_rm_removes_planted_links_without_following_them(
    outdir: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "host-dir"
    victim.mkdir()
    (victim / "keep").write_text("host data")
    (outdir / "to-dir").symlink_to(victim)
    (outdir / "nested").mkdir()
    (outdir / "nested" / "to-dir").symlink_to(victim)
    (outdir / "nested" / "f").write_bytes(b"x")
    base = outdir.parents[1]
    remove_queue_dirs(base, "s1")
    assert not (base / "s1").exists()
    assert (victim / "keep").read_text() == "host data"


# -- lanes: one session cannot starve another --------------------------------------------------


def test_a_hung_read_holds_only_its_own_lane() -> None:
    release = threading.Event()

    async def scenario() -> None:
        lanes = Lanes(timeout=0.3)
        with pytest.raises(HostError, match=r"did not finish in 0\.3s"):
            await lanes.run("bad", release.wait)
        for _ in range(10):  # many sessions' work goes on while "bad" is stuck
            assert await lanes.run("good", lambda: 42) == 42
        with pytest.raises(HostError, match="did not finish"):
            await lanes.run("bad", lambda: 1)  # waits behind its own stuck read, bounded
        release.set()
        assert await lanes.run("bad", lambda: 2) == 2
        lanes.close("bad")
        lanes.close("good")

    try:
        asyncio.run(scenario())
    finally:
        release.set()


# -- config ------------------------------------------------------------------------------------


def test_queue_limits_are_configurable_with_safe_defaults() -> None:
    assert parse_config("", "t").queues == QueueLimits()
    got = parse_config("[queues]\nmax_reply_bytes = 4096\noutbound_files = 10\n", "t").queues
    assert (got.max_reply_bytes, got.outbound_files) == (4096, 10)
    with pytest.raises(ConfigError, match=r"queues\.outbound_bytes"):
        parse_config("[queues]\noutbound_bytes = 1\n", "t")


def test_a_directory_swapped_for_a_fifo_link_mid_walk_is_never_opened(
    outdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.fwalk and shutil.rmtree check, then open by name without O_NOFOLLOW: a swap in
    between made them open (and block on) a FIFO. The walker's open refuses it instead."""
    fifo = tmp_path / "host.fifo"
    os.mkfifo(fifo)
    (outdir / "d").mkdir()
    (outdir / "d" / "f").write_bytes(b"x")
    os.chmod(outdir / "d" / "f", 0o4755)
    real_names = fdwalk._names

    def names_then_swap(dir_fd: int) -> list[str]:
        names = real_names(dir_fd)
        if "d" in names:  # listed as a directory; now the box swaps it
            os.rename(outdir / "d", outdir / "d.old")
            (outdir / "d").symlink_to(fifo)
        return names

    monkeypatch.setattr(fdwalk, "_names", names_then_swap)
    done = threading.Event()
    stuck: list[bool] = []

    def unblock_if_stuck() -> None:  # a blocked opener would hang the test: free it, then fail
        while not done.wait(0.01):
            if fifo_reader_count(fifo):
                stuck.append(True)

    guard = threading.Thread(target=unblock_if_stuck)
    guard.start()
    try:
        strip_setid(outdir, UID, 100)
        monkeypatch.setattr(fdwalk, "_names", real_names)
        remove_tree(outdir)
    finally:
        done.set()
        guard.join()
    assert not stuck, "the walker opened the FIFO"
    assert not outdir.exists()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_the_record_rebuilds_an_outbound_db_the_reader_and_verify_accept(outdir: Path) -> None:
    record = [(1, 1, 1.5, "one"), (2, 0, 0.0, "[ironclawd refused reply 2: x]"), (3, 2, 3.0, "é")]
    scratch = outdir.parents[2] / "scratch"
    owner = (UID, os.getgid())
    assert restore_outbound(outdir, KEY, owner, iter(record), scratch) == 3
    st = os.lstat(outdir / "outbound.db")
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, UID)
    rows = reader(outdir).read_after(0, 10, CAP)
    assert [accept_row(*raw, CAP)[0] for raw in rows] == record
    with pytest.raises(HostError, match="File exists"):  # never over what the box has
        restore_outbound(outdir, KEY, owner, iter(record), scratch)
