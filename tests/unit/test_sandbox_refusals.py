"""A sandbox's refused gRPC calls are audited (ironclawd/api/sandbox.py), but a looping agent
cannot fill the disk through the audit log: at most N records a minute per session, and the
next record after a quiet spell counts what was left out."""

from __future__ import annotations

import pytest

from ironclawd.api import sandbox
from ironclawd.api.sandbox import SandboxPeer, _RefusalAudit


class Recorder:
    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, object]]] = []

    def record(self, event: str, actor: str, **fields: object) -> None:
        self.records.append((event, actor, fields))


def test_refusals_are_recorded_per_session_at_a_bounded_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(sandbox.time, "monotonic", lambda: now[0])
    audit = Recorder()
    refused = _RefusalAudit(audit, per_minute=3)
    peer, other = SandboxPeer("s1", "gateway"), SandboxPeer("s2", "model")
    approve = "/ironclaw.admin.v1.AdminService/ApproveChange"
    for _ in range(10):
        refused(peer, approve, "no such method")
    refused(other, "/x/" + "y" * 500, "not served on this socket")
    assert [(e, a) for e, a, _ in audit.records] == [("sandbox.refused", "session:s1")] * 3 + [
        ("sandbox.refused", "session:s2")
    ]
    assert audit.records[0][2] == {
        "reason": "no such method",
        "socket": "gateway",
        "method": approve,
    }
    assert len(str(audit.records[-1][2]["method"])) == 200  # clipped
    now[0] += 60
    refused(peer, approve, "no such method")
    assert audit.records[-1][2]["unrecorded_before"] == 7
    refused(peer, approve, "no such method")
    assert "unrecorded_before" not in audit.records[-1][2]


def test_an_unknown_peer_is_still_recorded() -> None:
    audit = Recorder()
    _RefusalAudit(audit)(None, "/a/b", "not served on this socket")
    assert audit.records == [
        ("sandbox.refused", "session:?", {"reason": "not served on this socket", "socket": "?",
                                          "method": "/a/b"}),
    ]  # fmt: skip
