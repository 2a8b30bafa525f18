"""Refusals an untrusted party can cause at will are audited, but a looping agent cannot fill
the disk through the audit log (ironclawd/services/audit.Throttled): at most N records a minute
per key, and the next record after a quiet spell counts what was left out. A sandbox's refused
gRPC calls (ironclawd/api/sandbox_calls.py) and change submissions the gateway refuses use it."""

from __future__ import annotations

from ironclawd.api.sandbox_calls import RefusalAudit
from ironclawd.api.sandbox_sockets import SandboxPeer
from ironclawd.services.audit import Throttled
from tests.fakes import FakeClock, RecordingAudit


def test_records_are_bounded_per_key_and_the_gap_is_counted() -> None:
    clock = FakeClock(monotonic=100.0)
    audit = RecordingAudit()
    throttled = Throttled(audit, clock, per_minute=3)
    recorded = [throttled.record("s1", "x.refused", "session:s1", n=n) for n in range(10)]
    assert recorded == [True] * 3 + [False] * 7
    assert throttled.record("s2", "x.refused", "session:s2")  # another key is not held up
    assert [r[2].get("n") for r in audit.records] == [0, 1, 2, None]
    clock.advance(59.9)
    assert not throttled.record("s1", "x.refused", "session:s1")
    clock.advance(0.1)
    assert throttled.record("s1", "x.refused", "session:s1", n=99)
    assert audit.records[-1] == ("x.refused", "session:s1", {"n": 99, "unrecorded_before": 8})
    assert throttled.record("s1", "x.refused", "session:s1")
    assert "unrecorded_before" not in audit.records[-1][2]


def test_a_sandbox_refusal_names_session_socket_and_clipped_method() -> None:
    audit = RecordingAudit()
    refused = RefusalAudit(audit, FakeClock())
    approve = "/ironclaw.admin.v1.AdminService/ApproveChange"
    refused(SandboxPeer("s1", "gateway"), approve, "no such method")
    refused(None, "/x/" + "y" * 500, "not served on this socket")
    assert audit.records[0] == (
        "sandbox.refused",
        "session:s1",
        {"reason": "no such method", "socket": "gateway", "method": approve},
    )
    event, actor, fields = audit.records[1]
    assert (event, actor, fields["socket"]) == ("sandbox.refused", "session:?", "?")
    assert len(str(fields["method"])) == 200
