"""``ports.AuditSink``: the fake (tests/fakes/audit.py ``RecordingAudit``) and the real one
(services/audit.py ``Audit`` over the MAC-chained file of store/audit.py, in a tmp dir) keep,
refuse and lose the same records. ``record`` is durable on return and raises what it cannot
write; ``record_soon`` refuses a field named like the chain's own at once, and a record it
cannot write later is lost alone: the records queued with it are still written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ironclawd.errors import HostError
from ironclawd.services.audit import Audit
from ironclawd.store.audit import MAX_RECORD, AuditLog
from tests.fakes import MemoryAuditHead
from tests.fakes.audit import RecordingAudit

Kept = list[tuple[str, str, dict[str, object]]]
CHAIN = ("seq", "time", "event", "actor", "prev", "mac")


@pytest.fixture(params=["fake", "real"])
def sink(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Audit | RecordingAudit]:
    if request.param == "fake":
        yield RecordingAudit()
        return
    real = Audit(AuditLog(tmp_path / "audit.log", bytes(range(32))), MemoryAuditHead())
    try:
        yield real
    finally:
        real.close()


def kept(sink: Audit | RecordingAudit) -> Kept:
    """What the sink holds once everything queued was written."""
    if isinstance(sink, RecordingAudit):
        return list(sink.records)
    sink.close()  # writes what is queued
    return [(r["event"], r["actor"], {k: v for k, v in r.items() if k not in CHAIN})
            for r in sink.read(0, 1000)]  # fmt: skip


def test_records_are_kept_in_the_order_given_with_their_fields(
    sink: Audit | RecordingAudit,
) -> None:
    sink.record("gate.a", "operator:1000", change=1)
    sink.record("gate.b", "operator:1000", change=2, note="é")
    for n in range(3):
        sink.record_soon("model.call", "session:s1", tokens_in=n, ok=True, ms=1.5)
    records = kept(sink)
    assert [r for r in records if r[0].startswith("gate.")] == [
        ("gate.a", "operator:1000", {"change": 1}),
        ("gate.b", "operator:1000", {"change": 2, "note": "é"}),
    ]
    assert [r for r in records if r[0] == "model.call"] == [
        ("model.call", "session:s1", {"tokens_in": n, "ok": True, "ms": 1.5}) for n in range(3)
    ]


@pytest.mark.parametrize("name", ["seq", "time", "prev", "mac"])
def test_a_field_named_like_the_chains_own_is_refused_at_once(
    sink: Audit | RecordingAudit, name: str
) -> None:
    with pytest.raises(ValueError, match=f"field\\(s\\) {name} are the chain's own"):
        sink.record("reply.refused", "ironclawd", **{name: 1})
    with pytest.raises(ValueError, match=f"field\\(s\\) {name} are the chain's own"):
        sink.record_soon("model.call", "session:s1", **{name: 1})
    assert kept(sink) == []


def test_a_record_that_cannot_be_written_is_lost_alone(sink: Audit | RecordingAudit) -> None:
    """An unserializable value once stopped the group-commit writer for good (every later
    model call, egress decision and MCP call unrecorded), and an oversized record lost the
    records queued with it."""
    big = "x" * MAX_RECORD
    with pytest.raises(TypeError, match="bytes"):
        sink.record("gate.a", "operator:1000", blob=b"raw")
    with pytest.raises(HostError, match="too large"):
        sink.record("gate.b", "operator:1000", blob=big)
    sink.record_soon("egress.decision", "session:s1", n=1)
    sink.record_soon("egress.decision", "session:s1", n=2, blob=big)
    sink.record_soon("egress.decision", "session:s1", n=3, blob=b"raw")
    sink.record_soon("egress.decision", "session:s1", n=4)
    sink.record("gate.c", "operator:1000", change=5)  # and durable records still go in
    records = kept(sink)
    assert [f["n"] for e, _, f in records if e == "egress.decision"] == [1, 4]
    assert [e for e, _, _ in records if e.startswith("gate.")] == ["gate.c"]
