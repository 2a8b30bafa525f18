"""``ports.AuditLogFile``: the in-memory fake (tests/fakes/audit.py) and the MAC-chained file
(store/audit.py, on a real file in a tmp dir) number, link, page and verify alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ironclawd.store.audit import GENESIS, AuditLog
from tests.fakes import MemoryAuditLog

KEY = bytes(range(32))


@pytest.fixture(params=["fake", "real"])
def audit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AuditLog | MemoryAuditLog]:
    log: AuditLog | MemoryAuditLog
    log = MemoryAuditLog() if request.param == "fake" else AuditLog(tmp_path / "audit.log", KEY)
    try:
        yield log
    finally:
        log.close()


def test_appends_are_numbered_and_linked_and_the_head_follows(
    audit: AuditLog | MemoryAuditLog,
) -> None:
    assert audit.head == (0, GENESIS)
    first = audit.append("session.created", "uid:0(root)", sid="s1")
    second = audit.append("session.stopped", "ironclawd", sync=False, sid="s1")
    audit.sync()
    assert [first["seq"], second["seq"]] == [1, 2]
    assert first["prev"] == GENESIS
    assert second["prev"] == first["mac"]
    assert second["sid"] == "s1"
    assert audit.head == (2, second["mac"])


def test_read_pages_after_a_seq(audit: AuditLog | MemoryAuditLog) -> None:
    written = [audit.append("e", "a", n=n) for n in range(5)]
    assert audit.read() == written
    assert audit.read(after=2) == written[2:]
    assert audit.read(after=1, limit=2) == written[1:3]
    assert audit.read(after=5) == []


def test_an_untouched_log_verifies_against_its_head(audit: AuditLog | MemoryAuditLog) -> None:
    assert audit.verify() == audit.verify(audit.head)
    assert audit.verify().ok
    for n in range(3):
        audit.append("e", "a", n=n)
    result = audit.verify(audit.head)
    assert result.ok
    assert result.records == 3
    assert result.repairs == 0


def test_verify_names_records_missing_before_the_remembered_head(
    audit: AuditLog | MemoryAuditLog,
) -> None:
    audit.append("e", "a")
    result = audit.verify((3, "f" * 64))
    assert not result.ok
    assert result.first_bad == 2
    assert result.problem == "log truncated: 3 records were written"
    changed = audit.verify((1, "f" * 64))
    assert changed.problem == "last record differs from the remembered one"


def test_continue_after_a_head_the_log_ends_before(audit: AuditLog | MemoryAuditLog) -> None:
    record = audit.append("e", "a")
    assert not audit.continue_after((1, record["mac"]))  # the same head: nothing to do
    assert not audit.continue_after((0, GENESIS))  # the log is ahead: fine
    assert audit.continue_after((7, "c" * 64))
    assert audit.head == (7, "c" * 64)
    after = audit.append("e", "a")
    assert after["seq"] == 8
    assert after["prev"] == "c" * 64
    assert audit.verify().problem.startswith("expected seq 2, found 8")


def test_a_field_named_like_the_chain_is_refused(audit: AuditLog | MemoryAuditLog) -> None:
    with pytest.raises(ValueError, match=r"audit record for e: field\(s\) mac, seq are"):
        audit.append("e", "a", seq=1, mac="x")
    assert audit.head == (0, GENESIS)
