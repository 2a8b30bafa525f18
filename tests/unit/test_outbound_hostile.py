"""Hostile outbound.db files against the daemon's reader (store/outbound.py) and its ingest
(services/messaging.py), from a review that showed each: a 32 KiB file whose schema table's
pages point at one another kept a daemon thread busy for ever; a 1.1 MB file whose 1000 rows
share one chain of overflow pages was ingested as 1 GiB of replies; and every "outbound <seq>"
announcement cost a copy of the whole file, however often the file was unchanged. Also what
the fixes must not break: a genuine file too large for one read still arrives whole.

The files are real SQLCipher under the session's key (tests/unit/outbound_craft.py builds the
hostile ones page by page; the agent's own queue code, agent/queues.py, the genuine ones), read
by the real OutboundReader. The agent's uid is the test's own (the unit tier may not chown)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.queues import Outbound as AgentOutbound
from ironclawd.domain.messages import QueueLimits
from ironclawd.errors import HostError
from ironclawd.store import outbound
from ironclawd.store.outbound import OutboundReader, RawRow
from tests.contract.test_inbox_ports import AGENT, real_services
from tests.fakes import FakeSessionData
from tests.unit import outbound_craft

KEY = bytes(range(32))
UID = os.getuid()
CAP = QueueLimits().max_reply_bytes  # 1 MiB: the longest body the ingest takes
QUOTA = QueueLimits().outbound_bytes  # 64 MiB: the largest file the reader copies
BUDGET = 0.3  # s of CPU per read, for these tests (2 s in the daemon)
WAIT = 10.0  # s for a read that must end at its budget (before the fix it never ended)
# A schema table of 7 pages each pointing its 557 children at the next: its scan visits the
# schema row 557**6 (~3e16) times, which no one waits out (~18 us each).
FOREVER = (556, 6)


@pytest.fixture
def outdir(tmp_path: Path) -> Path:
    d = tmp_path / "queues" / "s1" / "outbound"
    d.mkdir(parents=True, mode=0o700)
    return d


def reader(outdir: Path) -> OutboundReader:
    return OutboundReader(outdir, KEY, UID, outdir.parents[2] / "scratch", QUOTA)


class Clock:
    """``time`` as store/outbound.py sees it, with a monotonic clock the test moves: the reader
    rests for seconds after a hostile file, which a test should not sleep through. Thread CPU
    time (the budget) and sleeps are real."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def thread_time(self) -> float:
        return time.thread_time()

    def time(self) -> float:  # the file times a copy is compared with are the real clock's
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The reader on the test's clock and a CPU budget short enough for a unit test."""
    fake = Clock()
    monkeypatch.setattr(outbound, "time", fake)
    monkeypatch.setattr(outbound, "QUERY_CPU_SECONDS", BUDGET)
    return fake


def ended_with(read: Callable[[], object]) -> BaseException | None:
    """What ``read`` raised (None if nothing), run in a thread of its own: a read that does not
    end within WAIT fails the test instead of hanging it, and, as a daemon thread, lets pytest
    exit (before the budget, such a thread spun until the process ended)."""
    ended: list[BaseException | None] = []

    def run() -> None:
        try:
            read()
        except BaseException as exc:
            ended.append(exc)
        else:
            ended.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT)
    assert ended, f"the read of a crafted file did not end in {WAIT} s"
    return ended[0]


def count_copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gains an entry for each copy of outbound.db the reader begins (its sendfile
    from the start of the agent's file)."""
    copies: list[int] = []
    real_sendfile = os.sendfile

    def sendfile(out: int, src: int, offset: int | None, count: int) -> int:
        if os.lseek(src, 0, os.SEEK_CUR) == 0:
            copies.append(src)
        return real_sendfile(out, src, offset, count)

    monkeypatch.setattr(os, "sendfile", sendfile)
    return copies


def watch_reader(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that gains "file" each time the reader looks at the agent's file, and "sqlite"
    each time it opens or queries its copy."""
    seen: list[str] = []
    real_copy, real_select, real_connect = (
        outbound._private_copy, outbound._select, OutboundReader._connect,
    )  # fmt: skip

    def private_copy(*args: Any) -> Any:
        seen.append("file")
        return real_copy(*args)

    def select(*args: Any, **kwargs: Any) -> Any:
        seen.append("sqlite")
        return real_select(*args, **kwargs)

    def connect(self: OutboundReader) -> Any:
        seen.append("sqlite")
        return real_connect(self)

    monkeypatch.setattr(outbound, "_private_copy", private_copy)
    monkeypatch.setattr(outbound, "_select", select)
    monkeypatch.setattr(OutboundReader, "_connect", connect)
    return seen


class AgentFiles(FakeSessionData):
    """Fake keys and inbound queues; each session's outbound queue is a real file under
    ``base``, read by the real OutboundReader as the daemon reads it."""

    def __init__(self, base: Path) -> None:
        super().__init__()
        self.base = base

    def outbound_db(self, sid: str) -> Path:
        directory = self.base / sid / "outbound"
        directory.mkdir(parents=True, exist_ok=True)
        return directory / "outbound.db"

    def outbound(self, sid: str, uid: int) -> Any:
        return OutboundReader(
            self.outbound_db(sid).parent, self.key(sid), UID, self.base / "scratch", QUOTA
        )


# -- the crafted files are files SQLCipher reads -----------------------------------------------


def test_the_crafted_files_are_real_sqlcipher_files_when_nothing_is_shared(outdir: Path) -> None:
    """Without the attack (one path to the schema row, one row on the overflow chain) the
    reader takes them: what is refused below is refused for the attack, not for a bad page."""
    db = outdir / "outbound.db"
    db.write_bytes(outbound_craft.dag_schema(KEY, 0, 1))
    assert reader(outdir).read_after(0, 1000, CAP) == []
    db.write_bytes(outbound_craft.shared_overflow(KEY, 1, CAP))
    ((seq, in_reply_to, created_at, body),) = reader(outdir).read_after(0, 1000, CAP)
    assert (seq, in_reply_to, created_at) == (1, 1, 1.0)
    assert body is not None
    assert CAP - 2 * 4096 < len(body) <= CAP
    assert set(body) == {ord("A")}


# -- a schema table whose pages point at one another -------------------------------------------


def test_a_schema_whose_pages_all_point_at_one_another_costs_one_cpu_budget_then_is_refused(
    outdir: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review's 32 KiB file: the read ends at its CPU budget; then the reader rests, and
    after its rest still refuses that file, but not the next one the agent makes."""
    monkeypatch.setattr(outbound, "RACY_SECONDS", -1.0)  # file times move with every write here
    db = outdir / "outbound.db"
    db.write_bytes(outbound_craft.dag_schema(KEY, *FOREVER))
    assert db.stat().st_size == 8 * 4096
    kept = reader(outdir)
    # Before: this read never ended, in a thread nothing could stop.
    assert isinstance(ended_with(lambda: kept.read_after(0, 1000, CAP)), HostError)
    seen, copies = watch_reader(monkeypatch), count_copies(monkeypatch)
    # At once again (the box re-announcing): refused, without even looking at the file.
    with pytest.raises(HostError, match=r"refusing outbound\.db for 2 s more"):
        kept.read_after(0, 1000, CAP)
    assert seen == []
    clock.now += outbound.REST_SECONDS
    # Rested: the same file is still refused, looked at but not copied, and never queried.
    with pytest.raises(HostError, match="unchanged since it was refused"):
        kept.read_after(0, 1000, CAP)
    assert (seen, copies) == (["file"], [])
    # A file the agent made anew is read as ever.
    db.unlink()
    AgentOutbound(db, KEY).append(1, "a genuine reply")
    assert [(row[0], row[3]) for row in kept.read_after(0, 1000, CAP)] == [(1, b"a genuine reply")]


def test_crafted_file_after_crafted_file_rests_the_reader_longer_each_time(
    outdir: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A box writing a new crafted file for every read costs the daemon one budget per rest,
    and the rests grow (to a cap)."""
    monkeypatch.setattr(outbound, "REST_SECONDS", 1.0)
    monkeypatch.setattr(outbound, "REST_MAX_SECONDS", 3.0)
    db, kept = outdir / "outbound.db", reader(outdir)
    for rest in (1.0, 2.0, 3.0):
        db.write_bytes(outbound_craft.dag_schema(KEY, *FOREVER))  # not the file refused before
        refused_at = clock.now
        assert isinstance(ended_with(lambda: kept.read_after(0, 1000, CAP)), HostError)
        clock.now = refused_at + rest - 0.01
        with pytest.raises(HostError, match=r"refusing outbound\.db for 0 s more"):
            kept.read_after(0, 1000, CAP)
        clock.now = refused_at + rest  # rested: the next crafted file is read (and refused)


# -- rows that share one chain of overflow pages -----------------------------------------------


def test_rows_sharing_one_overflow_chain_are_refused_and_rest_the_reader(
    outdir: Path, clock: Clock
) -> None:
    data = outbound_craft.shared_overflow(KEY, 1000, CAP)  # 1000 bodies of ~1 MiB
    assert len(data) < 2 * CAP  # before: read as 1000 rows, 1 GiB
    (outdir / "outbound.db").write_bytes(data)
    kept = reader(outdir)
    with pytest.raises(HostError, match="its rows hold more bytes than the file"):
        kept.read_after(0, 1000, CAP)
    with pytest.raises(HostError, match=r"refusing outbound\.db for 2 s more"):
        kept.read_after(0, 1000, CAP)


def test_ingest_records_nothing_of_rows_sharing_one_overflow_chain(tmp_path: Path) -> None:
    async def go() -> tuple[int, int]:
        data = AgentFiles(tmp_path)
        sessions, messages, *_ = real_services(data)
        try:
            sid = (await sessions.create(AGENT, "sharedchain01")).sid
            crafted = outbound_craft.shared_overflow(data.key(sid), 1000, CAP)
            data.outbound_db(sid).write_bytes(crafted)
            ingested = await messages.ingest(sid, 1000)  # as "outbound 1000" announces
            return ingested, len(messages.store.replies_after(sid, 0, 2000))
        finally:
            await sessions.close()

    assert asyncio.run(go()) == (0, 0)  # before: (1000, 1000), 1 GiB of bodies


# -- a genuine file too large for one read -----------------------------------------------------


def test_a_read_stops_at_batch_bytes_and_ingest_takes_every_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's own queue code writes 30 replies of 400 KiB (12 MiB). A read stops at the
    first row that brings its bodies to BATCH_BYTES; an ingest reads on while its batches come
    back whole, so one announcement still takes all 30."""
    batch_bytes = 1 << 20
    monkeypatch.setattr(outbound, "BATCH_BYTES", batch_bytes)
    bodies = [f"{seq:04d}".ljust(400 * 1024, "x") for seq in range(1, 31)]

    async def go() -> list[str]:
        data = AgentFiles(tmp_path)
        sessions, messages, *_ = real_services(data)
        try:
            sid = (await sessions.create(AGENT, "bigreplies001")).sid
            for seq in range(1, 31):
                await messages.send(sid, f"message {seq}")
            agent = AgentOutbound(data.outbound_db(sid), data.key(sid))
            assert [agent.append(n, body) for n, body in enumerate(bodies, 1)] == list(range(1, 31))
            batches: list[list[RawRow]] = []
            kept = data.outbound(sid, UID)
            while batch := kept.read_after(batches[-1][-1][0] if batches else 0, 1000, CAP):
                batches.append(batch)
            sizes = [[len(row[3] or b"") for row in batch] for batch in batches]
            assert [len(batch) for batch in batches] == [3] * 10  # 1.2 MiB each, before: [30]
            assert all(sum(s[:-1]) < batch_bytes <= sum(s) for s in sizes)
            assert [row[3] for batch in batches for row in batch] == [b.encode() for b in bodies]
            assert await messages.ingest(sid, 30) == 30  # before the loop's fix: 3
            return [reply.body for reply in messages.store.replies_after(sid, 0, 100)]
        finally:
            await sessions.close()

    assert asyncio.run(go()) == bodies


# -- an unchanged file is not copied again -----------------------------------------------------


def test_an_unchanged_file_is_copied_once_and_a_changed_one_again(
    outdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # File times here move with every write (Linux 6.13 and later): none is "racy".
    monkeypatch.setattr(outbound, "RACY_SECONDS", -1.0)
    db = outdir / "outbound.db"
    agent = AgentOutbound(db, KEY)
    for n in (1, 2, 3):
        agent.append(n, f"reply {n}")
    copies, kept = count_copies(monkeypatch), reader(outdir)
    first = kept.read_after(0, 1000, CAP)
    assert [row[0] for row in first] == [1, 2, 3]
    assert kept.read_after(0, 1000, CAP) == first  # from the copy already taken
    assert kept.read_after(3, 1000, CAP) == []  # rows announced but never written
    assert len(copies) == 1  # before: 3
    agent.append(4, "reply 4")
    assert [(row[0], row[3]) for row in kept.read_after(3, 1000, CAP)] == [(4, b"reply 4")]
    assert len(copies) == 2
    kept.close()  # the copy is gone, so the next read takes one
    assert [row[0] for row in kept.read_after(0, 1000, CAP)] == [1, 2, 3, 4]
    assert len(copies) == 3


def test_announcements_of_rows_never_written_copy_the_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review's flood: "outbound <seq far ahead>", over and over, each taken as a whole-file
    copy. Now the file is copied once, and the rows that are there are ingested once."""
    monkeypatch.setattr(outbound, "RACY_SECONDS", -1.0)
    copies = count_copies(monkeypatch)

    async def go() -> list[int]:
        data = AgentFiles(tmp_path)
        sessions, messages, *_ = real_services(data)
        try:
            sid = (await sessions.create(AGENT, "announcer0001")).sid
            await messages.send(sid, "one message")
            agent = AgentOutbound(data.outbound_db(sid), data.key(sid))
            agent.append(1, "one reply")
            agent.append(1, "x" * (512 * 1024))
            return [await messages.ingest(sid, 9_999_999_999) for _ in range(40)]
        finally:
            await sessions.close()

    assert asyncio.run(go()) == [2] + [0] * 39
    assert len(copies) == 1  # before: 40


def test_a_copy_taken_within_a_tick_of_a_write_is_taken_again(
    outdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where file times move once a kernel tick (before Linux 6.13), a commit in the same tick
    as the copy leaves size, mtime and ctime as they were: a copy that close to the file's last
    change is not trusted, and the next read copies again."""
    monkeypatch.setattr(outbound, "RACY_SECONDS", 3600.0)
    agent = AgentOutbound(outdir / "outbound.db", KEY)
    agent.append(1, "reply 1")
    copies, kept = count_copies(monkeypatch), reader(outdir)
    assert [row[0] for row in kept.read_after(0, 1000, CAP)] == [1]
    assert [row[0] for row in kept.read_after(0, 1000, CAP)] == [1]
    assert len(copies) == 2


def test_a_schema_text_claiming_900_mb_is_refused_before_it_is_built(outdir: Path) -> None:
    """A schema row claiming 900 MB of SQL, on an overflow page that names itself: SQLite
    built the text in one step of its VM, where no progress handler runs (15 s of CPU and
    3.4 GiB of memory). The reader's connections make no string longer than the file's quota."""
    (outdir / "outbound.db").write_bytes(outbound_craft.looping_schema(KEY, 900_000_000))
    started = time.thread_time()
    with pytest.raises(HostError, match="string or blob too big"):
        reader(outdir).read_after(0, 1000, CAP)
    assert time.thread_time() - started < 2.0


def test_rows_sharing_pages_are_counted_over_every_read_of_one_copy(
    outdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Padded with bytes SQLite never reads to more than a read's batch, the shared-overflow
    file passed a check made read by read: 1000 rows of 1 MiB came out of 12 MB. The bytes of
    bodies are counted over all the reads of one copy; a row read again is not counted twice."""
    monkeypatch.setattr(outbound, "BATCH_BYTES", 2 * 1024 * 1024)
    padding = os.urandom(6 * 1024 * 1024)
    data = outbound_craft.shared_overflow(KEY, 100, 1024 * 1024) + padding
    (outdir / "outbound.db").write_bytes(data)
    kept = reader(outdir)
    after, taken = 0, 0

    def read_all() -> None:
        nonlocal after, taken
        while rows := kept.read_after(after, 1000, CAP):
            assert kept.read_after(after, 1000, CAP) == rows  # the same rows again: no more bytes
            after = rows[-1][0]
            taken += sum(len(row[3] or b"") for row in rows)

    with pytest.raises(HostError, match="its rows hold more bytes than the file"):
        read_all()
    assert 0 < taken <= len(data)
