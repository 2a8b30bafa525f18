"""``ironctl change submit --kind persona`` without a persona opens $EDITOR on the agent's
current persona, then submits what was written. An edit takes minutes; a persona change applied
meanwhile (another operator's) was silently undone by the submitted text, which was written
from the persona as it had been. Now the persona is read again after the edit: if it changed,
nothing is submitted, the edited text is kept in a private file, and the error names it and
how to submit it once compared with the persona there now."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import editor, exitcodes, rpc, wire
from ironclawd.ctl.main import main

NO_DAEMON = ["--socket", "/nonexistent/ironclaw-admin.sock"]
ARGV = ["change", "submit", "--kind", "persona", "--agent", "demo", *NO_DAEMON]
EDITED = "You are terse.\nAnd kind."


class Daemon:
    """The persona is ``personas[0]`` at the first read, ``personas[1]`` at the next ones."""

    personas = ("You help.", "You help, in French.")

    def __init__(self, channel: Any) -> None:
        self.reads = 0
        self.submitted: list[Any] = []
        Daemon.last = self

    last: Daemon

    def GetAgent(self, request: Any, timeout: float) -> admin_pb2.GetAgentResponse:
        persona = self.personas[min(self.reads, 1)]
        self.reads += 1
        return admin_pb2.GetAgentResponse(agent=admin_pb2.Agent(name="demo", persona=persona))

    def SubmitChange(self, request: Any, timeout: float) -> admin_pb2.SubmitChangeResponse:
        self.submitted.append(request)
        return admin_pb2.SubmitChangeResponse(change=admin_pb2.Change(id="c0ffee0003"))


@pytest.fixture(autouse=True)
def world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(rpc, "stub_for", Daemon)
    monkeypatch.setattr(editor, "on_terminal", lambda: True)
    monkeypatch.setattr(editor, "edit", edited_as(EDITED))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def edited_as(text: str) -> Callable[..., editor.Edit]:
    """editor.edit, the editor closed with ``text`` written: the file stays, as the real
    one leaves it (0600, in the temporary directory) for the caller to keep or remove."""

    def edit(original: str, what: str, suffix: str = ".txt") -> editor.Edit:
        fd, path = tempfile.mkstemp(prefix="ironctl-", suffix=suffix)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        return editor.Edit(text, path)

    return edit


def test_a_persona_changed_during_the_edit_is_not_overwritten_and_the_text_is_kept(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(ARGV)
    out, err = capsys.readouterr()
    assert (code, out) == (exitcodes.CONFLICT, ""), (code, out, err)
    assert Daemon.last.submitted == []
    assert err.count("\n") == 1, err
    assert "the persona of demo changed while it was edited" in err, err
    assert "nothing submitted" in err
    kept = list(tmp_path.iterdir())
    assert len(kept) == 1
    assert kept[0].read_text(encoding="utf-8") == EDITED
    assert stat.S_IMODE(os.stat(kept[0]).st_mode) == 0o600
    assert f"--persona-file {kept[0]}" in err, err
    code = main([*ARGV, "--json"])
    out, err = capsys.readouterr()
    assert (code, err) == (exitcodes.CONFLICT, "")
    assert (
        json.loads(out)["error"]["code"] == "FAILED_PRECONDITION"
    )  # the daemon's own for a conflict


def test_a_persona_unchanged_during_the_edit_is_submitted(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    class Still(Daemon):
        personas = ("You help.", "You help.")

    monkeypatch.setattr(rpc, "stub_for", Still)
    assert main(ARGV) == exitcodes.OK, capsys.readouterr()
    assert [json.loads(r.payload_json) for r in Daemon.last.submitted] == [{"persona": EDITED}]
    assert list(tmp_path.iterdir()) == []


def test_an_edited_persona_the_daemon_refuses_is_kept(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    class Refusing(Daemon):
        personas = ("You help.", "You help.")

        def SubmitChange(self, request: Any, timeout: float) -> Any:
            raise wire.RpcError(wire.StatusCode.INVALID_ARGUMENT, "persona: too long")

    monkeypatch.setattr(rpc, "stub_for", Refusing)
    code = main(ARGV)
    out, err = capsys.readouterr()
    assert (code, out) == (exitcodes.INVALID, ""), (code, out, err)
    assert "persona: too long" in err
    kept = list(tmp_path.iterdir())
    assert len(kept) == 1
    assert kept[0].read_text(encoding="utf-8") == EDITED
    assert f"your text is kept in {kept[0]}" in err, err


def test_an_edited_persona_whose_submit_got_no_answer_is_not_said_unsubmitted(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The daemon may have stored the change when its answer did not come (the deadline
    passed, the connection broke): "nothing submitted" would have the operator submit the
    text a second time, a second pending change of the same persona."""

    class Silent(Daemon):
        personas = ("You help.", "You help.")

        def SubmitChange(self, request: Any, timeout: float) -> Any:
            self.submitted.append(request)
            raise wire.RpcError(wire.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    monkeypatch.setattr(rpc, "stub_for", Silent)
    code = main(ARGV)
    out, err = capsys.readouterr()
    assert (code, out) == (exitcodes.TIMEOUT, ""), (code, out, err)
    assert "nothing submitted" not in err, err
    assert "whether the persona change was submitted is not known" in err, err
    assert "ironctl change pending" in err, err
    kept = list(tmp_path.iterdir())
    assert len(kept) == 1
    assert kept[0].read_text(encoding="utf-8") == EDITED
    assert f"your text is kept in {kept[0]}" in err, err
