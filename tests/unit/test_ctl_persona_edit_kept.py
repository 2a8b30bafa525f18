"""A persona edited in $EDITOR (``ironctl change submit --kind persona`` without a persona) is
not lost by Ctrl-C once the editor closed: pressed while the persona was read again or while
the edit was submitted, it took the text with it (found by a review). The file the edit is in
is kept and named (for the submit: whether it was submitted is not known). A kept file is
removed once its text is submitted: at the end of the same run, or later with --persona-file;
nothing else given as --persona-file is ever removed.

No editor runs (unit tier: no subprocess): subprocess.run is replaced by one that writes what
the operator would have written and exits 0, so editor.edit itself runs."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import editor, exitcodes, rpc, wire
from ironclawd.ctl.main import main
from tests.unit.test_ctl_steps_persona_edit import ARGV, Daemon

WRITTEN = "You are terse.\nAnd kind.\n"


class Still(Daemon):
    personas = ("You help.", "You help.")


@pytest.fixture(autouse=True)
def world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The temporary directory (``tmp_path/tmp``) and an editor that writes WRITTEN."""

    def run(argv: list[str], check: bool) -> subprocess.CompletedProcess[bytes]:
        Path(argv[-1]).write_text(WRITTEN, encoding="utf-8")
        return subprocess.CompletedProcess(argv, 0)

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setattr(editor, "on_terminal", lambda: True)
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.delenv("VISUAL", raising=False)
    monkeypatch.setenv("EDITOR", "vi")
    monkeypatch.setattr(rpc, "stub_for", Still)
    return tmp


def _kept(tmp: Path) -> Path:
    [kept] = tmp.iterdir()
    assert kept.read_text(encoding="utf-8") == WRITTEN
    assert kept.stat().st_mode & 0o777 == 0o600
    return kept


def test_ctrl_c_during_the_reread_keeps_the_edit_and_names_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, world: Path
) -> None:
    class Interrupted(Still):
        def GetAgent(self, request: Any, timeout: float) -> admin_pb2.GetAgentResponse:
            if self.reads:
                raise KeyboardInterrupt
            return super().GetAgent(request, timeout)

    monkeypatch.setattr(rpc, "stub_for", Interrupted)
    assert main(ARGV) == exitcodes.INTERRUPTED
    out, err = capsys.readouterr()
    kept = _kept(world)
    assert out == ""
    assert err == (
        f"\nironctl: interrupted: nothing submitted: your text is kept in {kept} "
        f"(--persona-file {kept})\n"
    )


def test_ctrl_c_during_the_submit_keeps_the_edit_and_says_the_outcome_is_not_known(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, world: Path
) -> None:
    class Interrupted(Still):
        def SubmitChange(self, request: Any, timeout: float) -> Any:
            raise KeyboardInterrupt

    monkeypatch.setattr(rpc, "stub_for", Interrupted)
    assert main(ARGV) == exitcodes.INTERRUPTED
    err = capsys.readouterr().err
    kept = _kept(world)
    assert err == (
        "\nironctl: interrupted: whether the persona change was submitted is not known: see "
        f"ironctl change pending; your text is kept in {kept} (--persona-file {kept})\n"
    )


def test_ctrl_c_as_the_edit_is_read_keeps_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, world: Path
) -> None:
    def interrupted(*args: Any) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(editor, "edited_text", interrupted)
    assert main(ARGV) == exitcodes.INTERRUPTED
    kept = _kept(world)
    assert f"interrupted: nothing submitted: your text is kept in {kept}" in capsys.readouterr().err


def test_ctrl_c_in_the_editor_and_an_unchanged_edit_keep_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, world: Path
) -> None:
    def interrupted(argv: list[str], check: bool) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess, "run", interrupted)
    assert main(ARGV) == exitcodes.INTERRUPTED
    monkeypatch.setattr(subprocess, "run", lambda a, check: subprocess.CompletedProcess(a, 0))
    assert main(ARGV) == exitcodes.FAILED  # EDIT_ABORTED: the persona as it was
    assert "unchanged: nothing submitted" in capsys.readouterr().err
    assert list(world.iterdir()) == []


def test_a_submitted_edit_leaves_no_file(world: Path) -> None:
    assert main(ARGV) == exitcodes.OK
    assert Daemon.last.submitted[0].payload_json == '{"persona": "You are terse.\\nAnd kind."}'
    assert list(world.iterdir()) == []


def _kept_by_a_refusal(monkeypatch: pytest.MonkeyPatch, world: Path) -> Path:
    class Refusing(Still):
        def SubmitChange(self, request: Any, timeout: float) -> Any:
            raise wire.RpcError(wire.StatusCode.UNAVAILABLE, "Socket closed", transport=True)

    monkeypatch.setattr(rpc, "stub_for", Refusing)
    assert main(ARGV) == exitcodes.UNAVAILABLE
    monkeypatch.setattr(rpc, "stub_for", Still)
    return _kept(world)


def test_a_kept_edit_submitted_with_persona_file_is_removed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, world: Path
) -> None:
    kept = _kept_by_a_refusal(monkeypatch, world)
    capsys.readouterr()
    assert main([*ARGV, "--persona-file", str(kept)]) == exitcodes.OK
    out, err = capsys.readouterr()
    assert not kept.exists()
    assert err == f"removed {kept}: the edit kept there is change c0ffee0003 now\n"
    assert "change c0ffee0003 is pending a human decision" in out


def test_a_kept_edit_is_not_removed_unless_submitted_as_it_was_read(
    monkeypatch: pytest.MonkeyPatch, world: Path
) -> None:
    kept = _kept_by_a_refusal(monkeypatch, world)

    class Refusing(Still):
        def SubmitChange(self, request: Any, timeout: float) -> Any:
            raise wire.RpcError(wire.StatusCode.INVALID_ARGUMENT, "persona: too long")

    class Silent(Still):
        def SubmitChange(self, request: Any, timeout: float) -> Any:
            raise wire.RpcError(wire.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    class EditedMeanwhile(Still):  # the operator saves the file again while it is submitted
        def SubmitChange(self, request: Any, timeout: float) -> Any:
            kept.write_text(WRITTEN + "More.\n", encoding="utf-8")
            return super().SubmitChange(request, timeout)

    for daemon, code in ((Refusing, exitcodes.INVALID), (Silent, exitcodes.TIMEOUT),
                         (EditedMeanwhile, exitcodes.OK)):  # fmt: skip
        monkeypatch.setattr(rpc, "stub_for", daemon)
        assert main([*ARGV, "--persona-file", str(kept)]) == code, daemon
        assert kept.exists(), daemon


@pytest.mark.parametrize(
    ("where", "mode"),
    [
        ("tmp/persona.md", 0o600),  # the operator's own name
        ("tmp/ironctl-abcd1234.md", 0o644),  # not as ironctl makes it
        ("elsewhere/ironctl-abcd1234.md", 0o600),  # not in the temporary directory
    ],
)
def test_a_persona_file_ironctl_did_not_keep_is_never_removed(
    tmp_path: Path, where: str, mode: int
) -> None:
    path = tmp_path / where
    path.parent.mkdir(exist_ok=True)
    path.write_text(WRITTEN, encoding="utf-8")
    os.chmod(path, mode)
    assert main([*ARGV, "--persona-file", str(path)]) == exitcodes.OK
    assert path.read_text(encoding="utf-8") == WRITTEN
