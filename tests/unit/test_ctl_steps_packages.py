"""``ironctl package add`` and ``package remove`` read the agent's requested packages, compute
the whole new list and submit it. A packages change applied between the read and the submit
(another operator's approval) was silently undone by the submitted list: the change said
"adding ripgrep" and, approved, also removed what the other change had added. Now ironctl
compares the list the daemon computed the change from (its ``before``) with the one it read;
if they differ, it withdraws (rejects) its own change and says what changed and to run the
command again; if even that fails, it names the pending change to reject."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, rpc, wire
from ironclawd.ctl.main import main

NO_DAEMON = ["--socket", "/nonexistent/ironclaw-admin.sock"]
SHA = "0" * 64


def _package(name: str) -> dict[str, Any]:
    return {"name": name, "version": "1", "architecture": "amd64", "sha256": SHA, "size": 1,
            "requested": True}  # fmt: skip


def _view(*names: str) -> str:
    return json.dumps({"packages": [_package(n) for n in names]}, sort_keys=True)


class Daemon:
    """The agent has jq when ironctl reads it; by the submit, curl was added (``moved``)."""

    last: Daemon
    moved = True
    reject_error: wire.RpcError | None = None

    def __init__(self, channel: Any) -> None:
        self.rejected: list[admin_pb2.RejectChangeRequest] = []
        self.submitted: list[admin_pb2.SubmitChangeRequest] = []
        Daemon.last = self

    def GetAgent(self, request: Any, timeout: float) -> admin_pb2.GetAgentResponse:
        return admin_pb2.GetAgentResponse(agent=admin_pb2.Agent(name="demo", view_json=_view("jq")))

    def SubmitChange(self, request: Any, timeout: float) -> admin_pb2.SubmitChangeResponse:
        self.submitted.append(request)
        before = _view("jq", "curl") if self.moved else _view("jq")
        change = admin_pb2.Change(id="c0ffee0002", kind="packages", agent="demo",
                                  payload_json=request.payload_json, before_json=before,
                                  hash=SHA, state="pending")  # fmt: skip
        return admin_pb2.SubmitChangeResponse(change=change)

    def RejectChange(self, request: Any, timeout: float) -> admin_pb2.RejectChangeResponse:
        if self.reject_error is not None:
            raise self.reject_error
        self.rejected.append(request)
        return admin_pb2.RejectChangeResponse(change=admin_pb2.Change(id=request.id))


COMMANDS = [
    ["package", "add", "ripgrep", "--agent", "demo"],
    ["package", "remove", "jq", "--agent", "demo"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_change_computed_from_an_outdated_list_is_withdrawn_and_said(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    monkeypatch.setattr(rpc, "stub_for", Daemon)
    code = main([*argv, *NO_DAEMON])
    out, err = capsys.readouterr()
    assert (code, out) == (exitcodes.CONFLICT, ""), (code, out, err)
    assert err.count("\n") == 1, err
    assert "requested packages changed" in err, err
    assert "were: jq; now: jq, curl" in err, err
    assert "change c0ffee0002, computed from the old list" in err, err
    assert "withdrawn (rejected) and nothing is pending" in err, err
    assert [r.id for r in Daemon.last.rejected] == ["c0ffee0002"]
    assert "outdated" in Daemon.last.rejected[0].note
    code = main([*argv, *NO_DAEMON, "--json"])
    out, err = capsys.readouterr()
    assert (code, err) == (exitcodes.CONFLICT, "")
    assert (
        json.loads(out)["error"]["code"] == "FAILED_PRECONDITION"
    )  # the daemon's own for a conflict


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_change_that_cannot_be_withdrawn_is_named_to_reject(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    class Refusing(Daemon):
        reject_error = wire.RpcError(wire.StatusCode.PERMISSION_DENIED, "not in group pkg")

    monkeypatch.setattr(rpc, "stub_for", Refusing)
    code = main([*argv, *NO_DAEMON])
    out, err = capsys.readouterr()
    assert (code, out) == (exitcodes.CONFLICT, ""), (code, out, err)
    assert "change c0ffee0002 is pending" in err, err
    assert "ironctl change reject c0ffee0002" in err, err
    assert "not in group pkg" in err


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_change_computed_from_the_current_list_is_left_pending(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    class Still(Daemon):
        moved = False

    monkeypatch.setattr(rpc, "stub_for", Still)
    code = main([*argv, *NO_DAEMON, "--json"])
    out, err = capsys.readouterr()
    assert (code, err) == (exitcodes.OK, "")
    assert json.loads(out)["id"] == "c0ffee0002"
    assert Daemon.last.rejected == []
