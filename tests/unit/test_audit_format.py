"""The audit record's format version (ironclawd/formats/audit.py): none means version 1.

``fixtures/audit/v1.log`` is a log written by store/audit.py before the version existed (key
``b"k" * 32``): two records, an ``audit.repaired`` after a torn tail was cut, one with non-ASCII
text and a nested field, and a last record behind torn bytes as versions before the cut-back
left them. It must verify, and be appended to, with not a byte of it changed.

A record of a version this ironclawd does not know (a newer one wrote it, before a downgrade)
is never appended after nor cut.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from pathlib import Path

import pytest

from ironclawd.errors import HostError
from ironclawd.formats import audit as audit_format
from ironclawd.store import audit as audit_store
from ironclawd.store.audit import AuditLog, canonical

KEY = b"k" * 32
FIXTURE = Path(__file__).parent / "fixtures" / "audit" / "v1.log"
FIXTURE_HEAD = (5, "ed8b3e5dc799e5e2e2893c03dc7a9a21c42fe16a8d06649951053e1335da7d40")
TORN = b'{"actor":"ironclawd","ev'  # a record a crash cut short


@pytest.fixture(autouse=True)
def no_append_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leave FS_APPEND_FL alone: these tests rewrite the file as a newer ironclawd would."""
    monkeypatch.setattr(audit_store, "_set_append_only", lambda fd: False)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    """A copy of the log written before the format version existed."""
    copy = tmp_path / "audit.log"
    copy.write_bytes(FIXTURE.read_bytes())
    return copy


def _newer(path: Path, version: object = 2) -> bytes:
    """The next record as a later format might write it: its number in ``format``, chained to
    the last record, and a MAC computed in a way version 1 does not know."""
    last, _torn = audit_store._parse(path.read_bytes().splitlines(keepends=True)[-1])
    record = {"seq": last["seq"] + 1, "time": last["time"] + 1, "event": "daemon.started",
              "actor": "ironclawd", "format": version, "prev": last["mac"]}  # fmt: skip
    record["mac"] = hmac.new(KEY, b"v2\n" + canonical(record), hashlib.sha256).hexdigest()
    return canonical(record) + b"\n"


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_log_written_before_the_version_verifies_and_is_appended_to_unchanged(
    path: Path,
) -> None:
    before = path.read_bytes()
    log = AuditLog(path, KEY)
    result = log.verify(FIXTURE_HEAD)
    assert (result.ok, result.records, result.first_bad, result.repairs) == (True, 5, 0, 2)
    assert log.head == FIXTURE_HEAD
    record = log.append("daemon.started", "ironclawd", version="1.0.0")
    log.close()
    assert audit_format.FIELD not in record  # version 1 is still written as the field's absence
    after = path.read_bytes()
    assert after == before + canonical(record) + b"\n"
    assert (record["seq"], record["prev"]) == (6, FIXTURE_HEAD[1])
    assert AuditLog(path, KEY).verify((6, str(record["mac"]))).ok


@pytest.mark.parametrize("version", [2, "1", True])
def test_a_log_ending_in_a_record_of_an_unknown_format_is_refused_left_as_it_is(
    path: Path, version: object
) -> None:
    """Before, the daemon cut the newer daemon's torn tail and chained its records onto the
    newer record: after an upgrade again, its own verify named them forged."""
    path.write_bytes(path.read_bytes() + _newer(path, version) + TORN)
    before, fds = path.read_bytes(), _open_fds()
    message = (f"refusing to append to audit log {path}: its last record (line 6) is of format "
               f"version {version!r}, this ironclawd knows version 1 (written by a newer "
               "ironclawd); the log is left as it is")  # fmt: skip
    with pytest.raises(HostError, match=re.escape(message)):
        AuditLog(path, KEY)
    assert path.read_bytes() == before  # neither appended to nor its torn tail cut
    assert _open_fds() == fds


def test_an_explicit_version_1_is_version_1(path: Path) -> None:
    last, _torn = audit_store._parse(path.read_bytes().splitlines(keepends=True)[-1])
    log = AuditLog(path, KEY)
    record = {"seq": 6, "time": last["time"] + 1, "event": "x", "actor": "ironclawd",
              "format": 1, "prev": last["mac"]}  # fmt: skip
    record["mac"] = log._mac(record)
    log.close()
    path.write_bytes(path.read_bytes() + canonical(record) + b"\n")
    log = AuditLog(path, KEY)
    assert log.head == (6, record["mac"])
    assert log.verify(log.head).ok
    log.close()


def test_no_caller_field_can_set_the_version(path: Path) -> None:
    before = path.read_bytes()
    log = AuditLog(path, KEY)
    with pytest.raises(ValueError, match="format"):
        log.append("daemon.started", "ironclawd", format=2)
    log.close()
    assert path.read_bytes() == before
