"""``ironctl change approve`` and ``reject``: GetChange, then the decision. The daemon applies an
approval in a task of its own that a client leaving does not cut (services/gateway.py): an
approval whose answer did not come in time (or whose connection broke) may well be applied. The
error was the bare status ("deadline_exceeded: Deadline Exceeded"); it now says whether the
decision took is not known and where to look, keeping the status and exit code."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, rpc, wire
from ironclawd.ctl.main import main

NO_DAEMON = ["--socket", "/nonexistent/ironclaw-admin.sock"]
CHANGE = admin_pb2.Change(id="c0ffee0004", kind="persona", agent="demo", hash="0" * 64)


def _daemon(error: wire.RpcError) -> type:
    class Daemon:
        def __init__(self, channel: Any) -> None:
            pass

        def GetChange(self, request: Any, timeout: float) -> admin_pb2.GetChangeResponse:
            return admin_pb2.GetChangeResponse(change=CHANGE)

        def ApproveChange(self, request: Any, timeout: float) -> Any:
            raise error

        RejectChange = ApproveChange

    return Daemon


@pytest.mark.parametrize("verb", ["approve", "reject"])
@pytest.mark.parametrize(
    ("status", "exit_code"),
    [
        (wire.StatusCode.DEADLINE_EXCEEDED, exitcodes.TIMEOUT),
        (wire.StatusCode.UNAVAILABLE, exitcodes.UNAVAILABLE),
    ],
)
def test_a_decision_without_an_answer_says_it_may_have_been_made(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    verb: str,
    status: wire.StatusCode,
    exit_code: int,
) -> None:
    monkeypatch.setattr(rpc, "stub_for", _daemon(wire.RpcError(status, "Socket closed")))
    code = main(["change", verb, CHANGE.id, "--yes", *NO_DAEMON])
    out, err = capsys.readouterr()
    assert (code, out) == (exit_code, ""), (code, out, err)
    assert err.count("\n") == 1, err
    assert "Socket closed" in err
    assert f"whether change c0ffee0004 was {verb}d is not known" in err, err
    assert "ironctl change show c0ffee0004" in err, err
    code = main(["change", verb, CHANGE.id, "--yes", "--json", *NO_DAEMON])
    out, err = capsys.readouterr()
    assert (code, err) == (exit_code, "")
    assert json.loads(out)["error"]["code"] == status.name


@pytest.mark.parametrize("verb", ["approve", "reject"])
def test_a_refused_decision_is_the_daemons_error_alone(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, verb: str
) -> None:
    error = wire.RpcError(wire.StatusCode.FAILED_PRECONDITION, "it is applied, not pending")
    monkeypatch.setattr(rpc, "stub_for", _daemon(error))
    code = main(["change", verb, CHANGE.id, "--yes", *NO_DAEMON])
    out, err = capsys.readouterr()
    assert out == ""
    assert code == exitcodes.for_status("FAILED_PRECONDITION")
    assert "not known" not in err
