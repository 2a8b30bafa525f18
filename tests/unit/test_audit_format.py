"""The audit record's format version (ironclawd/formats/audit.py): none means version 1.

``fixtures/audit/v1.log`` is a log written by store/audit.py before the version existed (key
``b"k" * 32``): two records, an ``audit.repaired`` after a torn tail was cut, one with non-ASCII
text and a nested field, and a last record behind torn bytes as versions before the cut-back
left them. It must verify, and be appended to, with not a byte of it changed.

A record of a version this ironclawd does not know (a newer one wrote it, before a downgrade)
is never appended after nor cut, and ``verify`` names it apart from tampering; a version-1
record whose number was changed is tampering.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes
from ironclawd.ctl.audit import cmd_audit_verify
from ironclawd.errors import HostError
from ironclawd.formats import audit as audit_format
from ironclawd.services.audit import Audit
from ironclawd.store import audit as audit_store
from ironclawd.store.audit import AuditLog, canonical
from tests.fakes import MemoryAuditHead

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


def test_verify_stops_at_the_first_record_of_an_unknown_format_and_names_it(path: Path) -> None:
    """Not TAMPERED (before: "MAC mismatch"), and nothing after it is vouched for: what follows
    chains through a MAC this version cannot check. Tampering before it is still tampering."""
    newer = _newer(path)
    path.write_bytes(path.read_bytes() + newer + b'{"seq":99}\n')
    log = AuditLog(path, KEY)
    result = log.verify((7, "0" * 64))
    assert (result.ok, result.records, result.first_bad) == (False, 5, 6), result
    assert result.problem == (
        "unknown format version 2, this ironclawd knows version 1 (written by a newer "
        "ironclawd, or altered if none has written to this log); 5 records before it "
        "verified, none from it on"
    )
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"agent":"demo"', b'"agent":"evil"')
    path.write_bytes(b"".join(lines))
    result = log.verify((7, "0" * 64))
    assert (result.ok, result.first_bad, result.problem) == (
        False, 2, "record altered (MAC mismatch)",
    )  # fmt: skip
    log.close()


@pytest.mark.parametrize("written", [{}, {"format": 1}])
def test_a_version_1_record_given_another_version_is_tampering(
    path: Path, written: dict[str, Any]
) -> None:
    """Marking an old record as of a newer format must not turn a forgery into "unknown
    format": its MAC is still version 1's, over the record without the change."""
    log = AuditLog(path, KEY)
    record = log.append("change.approved", "uid:1000(alice)", change="c0ffee0002")
    if written:  # the same record as written with the version named
        record = {k: v for k, v in record.items() if k != "mac"} | written
        record["mac"] = log._mac(record)
    old = FIXTURE.read_bytes()
    path.write_bytes(old + canonical(record) + b"\n")
    head = (6, str(record["mac"]))
    assert log.verify(head).ok  # version 1 either way, so far
    path.write_bytes(old + canonical({**record, "format": 2}) + b"\n")
    result = log.verify(head)
    assert (result.ok, result.records, result.first_bad) == (False, 5, 6)
    assert result.problem == "record altered (its format version changed from 1 to 2)"
    log.close()


def test_no_caller_field_can_set_the_version(path: Path) -> None:
    before = path.read_bytes()
    log = AuditLog(path, KEY)
    with pytest.raises(ValueError, match="format"):
        log.append("daemon.started", "ironclawd", format=2)
    log.close()
    assert path.read_bytes() == before


class _Stub:
    def __init__(self, reply: admin_pb2.VerifyAuditResponse) -> None:
        self.reply = reply

    def VerifyAudit(self, *_: Any, **__: Any) -> admin_pb2.VerifyAuditResponse:
        return self.reply


def test_ironctl_says_unknown_format_not_tampered(
    path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    audit = Audit(AuditLog(path, KEY), MemoryAuditHead())
    path.write_bytes(path.read_bytes() + _newer(path))  # as if written after this one started
    with caplog.at_level(logging.CRITICAL, "ironclawd.audit"):
        result = audit.verify()
    audit.close()
    assert not any(hasattr(r, "MESSAGE_ID") for r in caplog.records)  # not "chain broken"
    assert "verification stopped at record 6 (a format this version does not know)" in caplog.text
    reply = admin_pb2.VerifyAuditResponse(
        ok=result.ok, records=result.records, first_bad_seq=result.first_bad, problem=result.problem
    )
    args = argparse.Namespace(json=False, timeout=5.0)
    assert cmd_audit_verify(args, _Stub(reply)) == exitcodes.FAILED  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert out.startswith("audit log of an UNKNOWN FORMAT from record 6: unknown format version 2")
    assert "TAMPERED" not in out
    reply.problem = "record altered (MAC mismatch)"
    assert cmd_audit_verify(args, _Stub(reply)) == exitcodes.FAILED  # type: ignore[arg-type]
    assert capsys.readouterr().out.startswith("audit log TAMPERED: first bad record 6")


@pytest.mark.parametrize("mac", ["é" * 64, "\ud800" + "0" * 63, 12345, None])
@pytest.mark.parametrize("newer", [False, True])
def test_a_record_whose_mac_is_not_ascii_text_is_tampering_not_a_crash(
    path: Path, mac: object, newer: bool
) -> None:
    """A MAC altered to non-ASCII text (or a lone surrogate, or no string at all) is reported
    as tampering: compare_digest raised TypeError on such a str, and verify crashed instead of
    answering. Both walks are tried: the version-1 one and the one of a record of a newer
    format (which checks whether only its number was changed)."""
    lines = path.read_bytes().splitlines(keepends=True)
    record, _torn = audit_store._parse(lines[2])
    record["mac"] = mac
    if newer:
        record["format"] = 2
    lines[2] = json.dumps(record, separators=(",", ":")).encode() + b"\n"
    path.write_bytes(b"".join(lines))
    log = AuditLog(path, KEY)
    result = log.verify()
    log.close()
    assert (result.ok, result.first_bad) == (False, 3), result
    if not newer:
        assert result.problem == "record altered (MAC mismatch)"
