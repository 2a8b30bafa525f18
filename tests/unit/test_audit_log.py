"""The audit log (ironclawd/store/audit.py, ironclawd/services/audit.py): keyed, hash-chained
JSON lines whose head is also remembered in the state DB.

Each way of rewriting history — an edit, a truncation, a reorder, a deletion, an insertion, a
forged record with a recomputed plain sha256 — must make ``verify`` fail naming the first bad
record. Tampering needs the append-only flag off: the tests that rewrite the file run with the
flag not set (a tmpfs has none anyway); one test shows what the flag itself refuses.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import itertools
import json
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ironclawd.domain.audit import RESERVED
from ironclawd.errors import DiskFull
from ironclawd.services.audit import Audit
from ironclawd.store import audit as audit_store
from ironclawd.store.audit import GENESIS, AuditLog, canonical
from ironclawd.store.state import StateStore
from tests.fakes import MemoryAuditHead, MemoryAuditLog
from tests.harness.fixtures import skip_unless_required

KEY = b"k" * 32
N = 6


@pytest.fixture
def no_append_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leave FS_APPEND_FL alone, so the test can play the attacker who already removed it."""
    monkeypatch.setattr(audit_store, "_set_append_only", lambda fd: False)


@pytest.fixture
def written(tmp_path: Path, no_append_flag: None) -> Iterator[tuple[AuditLog, tuple[int, str]]]:
    """A log of N records and the head the daemon would have remembered."""
    log = AuditLog(tmp_path / "audit.log", KEY)
    for n in range(1, N + 1):
        log.append("change.submitted", f"uid:{n}(user{n})", change=f"chg-{n:012x}")
    yield log, log.head
    log.close()


def lines(log: AuditLog) -> list[bytes]:
    return log._path.read_bytes().splitlines(keepends=True)


def rewrite(log: AuditLog, new: list[bytes]) -> None:
    log._path.write_bytes(b"".join(new))


def test_an_untouched_log_verifies_and_chains_every_record(
    written: tuple[AuditLog, tuple[int, str]],
) -> None:
    log, head = written
    result = log.verify(head)
    assert (result.ok, result.records, result.first_bad, result.problem) == (True, N, 0, "")
    records = [json.loads(line) for line in lines(log)]
    assert [r["seq"] for r in records] == list(range(1, N + 1))
    assert records[0]["prev"] == GENESIS
    for earlier, later in itertools.pairwise(records):
        assert later["prev"] == earlier["mac"]
    assert head == (N, records[-1]["mac"])
    assert log.read(after=4) == records[4:]


def test_an_edit_is_named(written: tuple[AuditLog, tuple[int, str]]) -> None:
    log, head = written
    new = lines(log)
    new[2] = new[2].replace(b"uid:3(user3)", b"uid:0(root)")
    rewrite(log, new)
    result = log.verify(head)
    assert (result.ok, result.first_bad) == (False, 3)
    assert "MAC mismatch" in result.problem
    assert result.records == 2  # the records before it are still good


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # A key given twice: the parser keeps the last, the real one (the MAC matched), but a
        # reader of the file, grep or a parser that keeps the first, saw the one put before it.
        (b'{"actor":', b'{"actor":"uid:0(root)","actor":'),
        (
            b'"event":"change.submitted"',
            b'"event":"change.rejected","event":"change.submitted"',
        ),
        # Anything else written otherwise than the daemon writes it: same record, other bytes.
        (b'","event":', b'", "event":'),
        (b"uid:3", b"\\u0075id:3"),
    ],
)
def test_a_record_not_in_the_bytes_the_daemon_wrote_is_named(
    written: tuple[AuditLog, tuple[int, str]], old: bytes, new: bytes
) -> None:
    """The MAC covers the parsed record, so before, an edit that parses to the same record
    verified: a key added twice changed what the line says to anyone but the verifier."""
    log, head = written
    changed = lines(log)
    assert old in changed[2]
    changed[2] = changed[2].replace(old, new, 1)
    rewrite(log, changed)
    result = log.verify(head)
    assert (result.ok, result.first_bad, result.records) == (False, 3, 2)
    assert "not as written" in result.problem


def test_a_truncated_tail_is_named_using_the_remembered_head(
    written: tuple[AuditLog, tuple[int, str]],
) -> None:
    log, head = written
    rewrite(log, lines(log)[:4])
    # Without the remembered head a clean cut is indistinguishable from a shorter log...
    assert log.verify(None).ok
    # ...with it, the first missing record is named.
    result = log.verify(head)
    assert (result.ok, result.first_bad) == (False, 5)
    assert f"{N} records were written" in result.problem
    # A cut in the middle of a line is named even without the head.
    rewrite(log, [*lines(log)[:3], lines(log)[3][:-20]])
    result = log.verify(None)
    assert (result.ok, result.first_bad) == (False, 4)


def test_a_reorder_is_named(written: tuple[AuditLog, tuple[int, str]]) -> None:
    log, head = written
    new = lines(log)
    new[1], new[2] = new[2], new[1]
    rewrite(log, new)
    result = log.verify(head)
    assert (result.ok, result.first_bad) == (False, 2)
    assert "expected seq 2, found 3" in result.problem


def test_a_deletion_is_named(written: tuple[AuditLog, tuple[int, str]]) -> None:
    log, head = written
    new = lines(log)
    del new[3]
    rewrite(log, new)
    result = log.verify(head)
    assert (result.ok, result.first_bad) == (False, 4)
    assert "expected seq 4, found 5" in result.problem


def _forge(prev_line: bytes, mac: str | None = None, **fields: Any) -> bytes:
    """A record as someone without the key would write it: right seq, right prev, and a
    sha256 over the canonical body in place of the HMAC."""
    prev = json.loads(prev_line)
    record = {"seq": prev["seq"] + 1, "time": prev["time"] + 1, "event": "change.approved",
              "actor": "uid:1000(alice)", **fields, "prev": prev["mac"]}  # fmt: skip
    record["mac"] = mac or hashlib.sha256(canonical(record)).hexdigest()
    return canonical(record) + b"\n"


def test_a_forged_record_with_a_recomputed_sha256_is_named_wherever_it_goes(
    written: tuple[AuditLog, tuple[int, str]],
) -> None:
    log, head = written
    original = lines(log)
    # Appended at the end, chained to the real last record.
    rewrite(log, [*original, _forge(original[-1], change="chg-000000000001")])
    result = log.verify(head)
    assert (result.ok, result.first_bad) == (False, N + 1)
    assert "MAC mismatch" in result.problem
    # Inserted in the middle, with every later record renumbered and re-chained by sha256.
    forged = original[:2]
    for _ in range(N - 1):
        forged.append(_forge(forged[-1]))
    rewrite(log, forged)
    result = log.verify(None)
    assert (result.ok, result.first_bad) == (False, 3)
    # A MAC under another key is no better than a plain hash.
    body = json.loads(_forge(original[-1]))
    del body["mac"]
    wrong = AuditLog.__new__(AuditLog)
    wrong._key = b"x" * 32
    rewrite(log, [*original, _forge(original[-1], mac=wrong._mac(body))])
    assert log.verify(head).first_bad == N + 1


@pytest.fixture
def opened() -> Iterator[Callable[[AuditLog, MemoryAuditHead], Audit]]:
    """Audit services over a log and a head store; each closed (if it can be) at the end."""
    made: list[Audit] = []

    def open_one(audit_log: AuditLog, store: MemoryAuditHead) -> Audit:
        made.append(Audit(audit_log, store))
        return made[-1]

    yield open_one
    for audit in made:
        getattr(audit, "close", lambda: None)()


def test_a_truncation_stays_visible_after_the_daemon_restarts(
    tmp_path: Path, no_append_flag: None, opened: Callable[[AuditLog, MemoryAuditHead], Audit]
) -> None:
    """The daemon remembers the head; reopening a shortened log must not let new records
    overwrite that memory and so hide the cut."""
    path, store = tmp_path / "audit.log", MemoryAuditHead()
    audit = opened(AuditLog(path, KEY), store)
    for n in range(N):
        audit.record("session.started", "ironclawd", sid=f"s{n}")
    assert audit.verify().ok
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:2]))
    restarted = opened(AuditLog(path, KEY), store)
    restarted.record("daemon.started", "ironclawd")
    result = restarted.verify()
    assert (result.ok, result.first_bad) == (False, 3), result
    # Emptied entirely: the same.
    path.write_bytes(b"")
    again = opened(AuditLog(path, KEY), store)
    again.record("daemon.started", "ironclawd")
    result = again.verify()
    assert (result.ok, result.first_bad) == (False, 1), result


def test_a_head_that_lags_the_file_is_not_tampering(
    tmp_path: Path, no_append_flag: None, opened: Callable[[AuditLog, MemoryAuditHead], Audit]
) -> None:
    """A crash between the append and remembering the head leaves the file one ahead."""
    path, store = tmp_path / "audit.log", MemoryAuditHead()
    log = AuditLog(path, KEY)
    for _ in range(3):
        log.append("x", "ironclawd")
    store.set_audit_head(2, "stale")
    audit = opened(AuditLog(path, KEY), store)
    audit.record("daemon.started", "ironclawd")
    assert audit.verify().ok
    assert store.head is not None
    assert store.head[0] == 4


def _flags(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = fcntl.ioctl(fd, audit_store.FS_IOC_GETFLAGS, struct.pack("i", 0))
        return int(struct.unpack("i", buf)[0])
    finally:
        os.close(fd)


def _clear_append_flag(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        flags = _flags(path) & ~audit_store.FS_APPEND_FL
        fcntl.ioctl(fd, audit_store.FS_IOC_SETFLAGS, struct.pack("i", flags))
    finally:
        os.close(fd)


def test_with_the_append_only_flag_even_the_owner_cannot_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path, KEY)
    try:
        if not log.append_only:
            skip_unless_required("this filesystem (or this user) cannot set FS_APPEND_FL")
        assert _flags(path) & audit_store.FS_APPEND_FL
        log.append("a", "ironclawd")
        for flags in (os.O_WRONLY | os.O_TRUNC, os.O_WRONLY):
            with pytest.raises(PermissionError):
                os.open(path, flags)
        with pytest.raises(PermissionError):
            path.unlink()
        log.append("b", "ironclawd")  # appending still works
        assert log.verify(log.head).ok
        assert log.head[0] == 2
    finally:
        log.close()
        if log.append_only:
            _clear_append_flag(path)  # or tmp_path could not be cleaned up


@pytest.mark.parametrize("name", sorted(RESERVED - {"event", "actor"}))
def test_a_field_named_like_the_chain_is_refused_and_nothing_is_written(
    tmp_path: Path, no_append_flag: None, name: str
) -> None:
    """A payload field called ``seq`` once renumbered the chain (``reply.refused`` carried the
    refused reply's seq): verify then named tampering and paging by seq skipped records.
    (``event`` and ``actor`` are append's own parameters: Python refuses those already.)"""
    log = AuditLog(tmp_path / "audit.log", KEY)
    log.append("first", "t")
    before = (tmp_path / "audit.log").read_bytes()
    clash: dict[str, Any] = {name: 1}  # Any: append's own keyword ``sync`` is a bool
    with pytest.raises(ValueError, match=name):
        log.append("clash", "t", **clash)
    assert (tmp_path / "audit.log").read_bytes() == before
    log.append("after", "t", reply_seq=1)
    assert log.head[0] == 2
    assert log.verify(log.head).ok


def test_the_group_writer_outlives_a_failed_sync_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sync (or the head's update) that fails is logged at critical level; the writer thread
    goes on and the next batch is written and synced."""

    class FailingOnce(MemoryAuditLog):
        failures = 1

        def sync(self) -> None:
            if self.failures:
                self.failures -= 1
                raise OSError("EIO on fsync")  # not a HostError: anything may come up here

    log = FailingOnce()
    audit = Audit(log, MemoryAuditHead())
    audit.record_soon("model.call", "session:s1", n=1)
    deadline = time.monotonic() + 5
    while log.failures and time.monotonic() < deadline:  # the first batch met the failure
        time.sleep(0.01)
    audit.record_soon("model.call", "session:s1", n=2)
    audit.close()
    assert [r["n"] for r in log.read()] == [1, 2]
    assert "AUDIT RECORDS NOT SYNCED (up to record 1): EIO on fsync" in caplog.text


def test_a_head_saved_late_by_another_thread_does_not_move_back(tmp_path: Path) -> None:
    """``Audit.record`` appends under the log's lock and saves the head after it; the batch
    writer does the same from its thread. Saved in the other order, the state DB held record
    1 as the head while the file held 2, and a cut of record 2 verified clean (stop 47's
    review). The real state store and log, the first save held until the second is done."""
    store = StateStore(tmp_path / "state.db", bytes(32))

    class SlowFirst:
        def __init__(self) -> None:
            self.second_saved = threading.Event()

        def audit_head(self) -> tuple[int, str] | None:
            return store.audit_head()

        def set_audit_head(self, seq: int, mac: str) -> None:
            if seq == 1:
                assert self.second_saved.wait(5)
            store.set_audit_head(seq, mac)
            if seq == 2:
                self.second_saved.set()

    log = AuditLog(tmp_path / "audit.log", b"k" * 32)
    audit = Audit(log, SlowFirst())
    first = threading.Thread(target=audit.record, args=("session.created", "root"))
    first.start()
    deadline = time.monotonic() + 5
    while log.head[0] < 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    audit.record("session.removed", "root")
    first.join(5)
    head = store.audit_head()
    assert head is not None
    assert head[0] == 2  # before: 1
    audit.close()
    log.close()
    store.close()


def test_bytes_someone_else_appended_are_never_a_reason_to_cut_a_record_of_ours(
    tmp_path: Path,
) -> None:
    """The append-only flag still lets root append. Bytes appended between two records moved
    the file's end past what this process counted, and a later failed write (a full disk) was
    cut back to that count: into the daemon's own last record, already synced (stop 47's
    review). A failed write is now cut back to the file's size before it."""
    path = tmp_path / "audit.log"
    full = False

    def write(fd: int, data: bytes) -> int:
        if full:
            os.write(fd, data[:10])
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)

    log = AuditLog(path, b"k" * 32, write=write)
    log.append("session.created", "root", sid="aaaaaaaa")
    with open(path, "ab") as appended:
        appended.write(b"X" * 20)
    second = log.append("session.removed", "root", sid="aaaaaaaa")
    full = True
    with pytest.raises(DiskFull):
        log.append("session.created", "root", sid="bbbbbbbb")
    data = path.read_bytes()
    assert data.endswith(b"\n")  # before: record 2's end was cut off
    assert data.splitlines()[-1].endswith(canonical(second))
    result = log.verify((2, str(second["mac"])))
    assert result.ok, result
    log.close()
