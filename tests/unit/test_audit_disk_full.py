"""Disk-full safety: audit appends are whole or absent (ironclawd/store/audit.py), a torn tail is
cut back and the cut recorded, and every "disk full" becomes DiskFull → RESOURCE_EXHAUSTED.

Short and failing writes are simulated with a ``write`` that writes part of the line to the real
file and then stops, exactly what write(2) does on a full filesystem."""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from ironclawd.api.status import code_for
from ironclawd.domain.messages import GENESIS, Reply
from ironclawd.errors import DiskFull
from ironclawd.store import audit as audit_store
from ironclawd.store.audit import REPAIRED, AuditLog
from ironclawd.store.diskspace import check_free
from ironclawd.store.state import StateStore
from tests.harness.fixtures import skip_unless_required

KEY = b"k" * 32


@pytest.fixture
def no_append_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit_store, "_set_append_only", lambda fd: False)


class FullDisk:
    """os.write that, while ``full``, writes ``keep`` bytes of the line and then either returns
    that short count or raises ENOSPC."""

    def __init__(self, keep: int, raise_enospc: bool) -> None:
        self.full = True
        self.keep = keep
        self.raise_enospc = raise_enospc

    def __call__(self, fd: int, data: bytes) -> int:
        if not self.full:
            return os.write(fd, data)
        written = os.write(fd, data[: self.keep]) if self.keep else 0
        if self.raise_enospc:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return written


def _events(log: AuditLog) -> list[str]:
    return [str(r["event"]) for r in log.read(0, 100)]


@pytest.mark.parametrize("raise_enospc", [False, True], ids=["short-write", "enospc"])
def test_a_write_torn_by_a_full_disk_is_cut_back_and_the_cut_recorded(
    tmp_path: Path, no_append_flag: None, raise_enospc: bool
) -> None:
    disk = FullDisk(keep=37, raise_enospc=raise_enospc)
    log = AuditLog(tmp_path / "audit.log", KEY, write=disk)
    disk.full = False
    log.append("a", "ironclawd")
    size = (tmp_path / "audit.log").stat().st_size
    disk.full = True
    for _ in range(3):  # every failed append leaves the file exactly as it was
        with pytest.raises(DiskFull, match="not written"):
            log.append("b", "ironclawd", detail="x" * 200)
        assert (tmp_path / "audit.log").stat().st_size == size
        assert log.head[0] == 1
    disk.full = False
    log.append("c", "ironclawd")
    assert _events(log) == ["a", REPAIRED, "c"]
    repaired = log.read(1, 1)[0]
    assert repaired["bytes_cut"] == 3 * 37
    assert repaired["at_offset"] == size
    result = log.verify(log.head)
    assert result.ok
    assert result.records == 3
    assert result.repairs == 1
    assert "cut back after a crash or a full disk" in result.problem
    log.close()


def test_a_tail_torn_by_a_crash_is_cut_at_open_and_the_cut_recorded(
    tmp_path: Path, no_append_flag: None
) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path, KEY)
    log.append("a", "ironclawd")
    log.append("b", "ironclawd")
    head = log.head
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"actor":"ironclawd","event":"c","ma')  # the crash
    again = AuditLog(path, KEY)
    assert again.head == head
    assert not path.read_bytes().endswith(b'"ma')
    again.append("d", "ironclawd")
    assert _events(again) == ["a", "b", REPAIRED, "d"]
    assert again.read(2, 1)[0]["bytes_cut"] == 36
    assert again.verify(again.head).ok
    again.close()


def test_a_torn_tail_is_not_tampering_but_a_bad_mac_still_is(
    tmp_path: Path, no_append_flag: None
) -> None:
    """A log torn by an older version (a partial record with the next one appended to it)
    verifies, naming the torn bytes; an edited record among them still fails."""
    path = tmp_path / "audit.log"
    disk = FullDisk(keep=0, raise_enospc=False)
    log = AuditLog(path, KEY, write=disk)
    disk.full = False
    for name in "abc":
        log.append(name, "ironclawd")
    lines = path.read_bytes().splitlines(keepends=True)
    # What the old append did: line 2's first bytes written, then line 2 again in full.
    path.write_bytes(lines[0] + lines[1][:25] + lines[1] + lines[2])
    result = AuditLog(path, KEY).verify(log.head)
    assert result.ok
    assert result.repairs == 1
    assert "before record(s) 2" in result.problem
    path.write_bytes(lines[0] + lines[1][:25] + lines[1].replace(b'"b"', b'"B"') + lines[2])
    result = AuditLog(path, KEY).verify(log.head)
    assert (result.ok, result.first_bad) == (False, 2)
    assert "MAC" in result.problem
    log.close()


def _flags(fd: int) -> int:
    return int(struct.unpack("i", fcntl.ioctl(fd, audit_store.FS_IOC_GETFLAGS, b"\0" * 4))[0])


def test_the_cut_works_through_the_append_only_flag_and_sets_it_again(tmp_path: Path) -> None:
    disk = FullDisk(keep=20, raise_enospc=False)
    log = AuditLog(tmp_path / "audit.log", KEY, write=disk)
    try:
        if not log.append_only:
            skip_unless_required("this filesystem (or this user) cannot set FS_APPEND_FL")
        disk.full = False
        log.append("a", "ironclawd")
        disk.full = True
        with pytest.raises(DiskFull):
            log.append("b", "ironclawd")
        assert _flags(log._fd) & audit_store.FS_APPEND_FL
        disk.full = False
        log.append("c", "ironclawd")
        assert _events(log) == ["a", REPAIRED, "c"]
        assert log.verify(log.head).ok
    finally:
        fd = log._fd
        fcntl.ioctl(fd, audit_store.FS_IOC_SETFLAGS, struct.pack("i", _flags(fd) & ~0x20))
        log.close()


def test_a_full_state_db_is_disk_full_and_leaves_no_transaction_open(tmp_path: Path) -> None:
    """SQLITE_FULL, from a page limit standing in for a full disk, becomes DiskFull naming the
    DB; the store keeps working once there is room again."""
    store = StateStore(tmp_path / "state.db", KEY)
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")
    reply: Callable[[int], Reply] = lambda seq: Reply(seq, 1, 1.0, "x" * 20000, GENESIS)  # noqa: E731
    with pytest.raises(DiskFull, match=r"state DB .*state\.db"):
        store.add_replies("s1", [reply(1)])
    assert store.last_reply("s1")[0] == 0
    store._db.execute("PRAGMA max_page_count = 1000000")
    store.add_replies("s1", [reply(1)])
    assert store.last_reply("s1")[0] == 1
    store.close()


def test_disk_full_is_resource_exhausted_naming_the_directory_and_the_threshold(
    tmp_path: Path,
) -> None:
    with pytest.raises(DiskFull) as caught:
        check_free(tmp_path, 2**62, "sending to session s1")
    message = str(caught.value)
    assert str(tmp_path) in message
    assert "daemon.min_free_bytes = " in message
    assert code_for(caught.value) is grpc.StatusCode.RESOURCE_EXHAUSTED
    check_free(tmp_path, 0, "off")
    check_free(tmp_path, 1, "plenty")


def test_a_torn_tail_longer_than_a_record_is_cut_to_the_last_whole_record(
    tmp_path: Path, no_append_flag: None
) -> None:
    """Several torn writes in a row (an older version on a full disk) never cut whole records."""
    path = tmp_path / "audit.log"
    log = AuditLog(path, KEY)
    log.append("a", "ironclawd")
    size, head = path.stat().st_size, log.head
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"actor":' * (audit_store.MAX_RECORD // 4))
    again = AuditLog(path, KEY)
    assert path.stat().st_size == size
    assert again.head == head
    again.close()
