"""The quickstart's spelling of ``ironctl change``: ``--group`` is ``--agent``; ``--by NAME`` is
only an assertion, checked against the caller the daemon reports, never sent as a claim; a
persona change without a persona off a terminal names what is missing; an edit that changes
nothing submits nothing."""

from __future__ import annotations

import io
import json
from typing import Any, ClassVar

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import editor, exitcodes, rpc
from ironclawd.ctl.caller import asserted_caller_matches
from ironclawd.ctl.common import CtlError
from ironclawd.ctl.main import build_parser, main

CHANGE = admin_pb2.Change(id="c1", kind="persona", agent="demo", state="pending", hash="h")


class Stub:
    """A daemon that sees the caller as uid 1000 (alice) and records what it is asked."""

    calls: ClassVar[list[tuple[str, Any]]] = []

    def __init__(self, channel: Any) -> None:
        pass

    def GetStatus(self, request: Any, timeout: float) -> admin_pb2.GetStatusResponse:
        Stub.calls.append(("GetStatus", request))
        caller = admin_pb2.Caller(uid=1000, gid=1000, pid=42, user_name="alice")
        return admin_pb2.GetStatusResponse(caller=caller)

    def SubmitChange(self, request: Any, timeout: float) -> admin_pb2.SubmitChangeResponse:
        Stub.calls.append(("SubmitChange", request))
        return admin_pb2.SubmitChangeResponse(change=CHANGE)

    def GetChange(self, request: Any, timeout: float) -> admin_pb2.GetChangeResponse:
        Stub.calls.append(("GetChange", request))
        return admin_pb2.GetChangeResponse(change=CHANGE)

    def ApproveChange(self, request: Any, timeout: float) -> admin_pb2.ApproveChangeResponse:
        Stub.calls.append(("ApproveChange", request))
        return admin_pb2.ApproveChangeResponse(change=CHANGE)


@pytest.fixture(autouse=True)
def stub(monkeypatch: pytest.MonkeyPatch) -> None:
    Stub.calls = []
    monkeypatch.setattr(rpc, "stub_for", Stub)
    monkeypatch.setattr(editor, "on_terminal", lambda: False)
    monkeypatch.setenv("NO_COLOR", "1")


def sent(name: str) -> list[Any]:
    return [request for called, request in Stub.calls if called == name]


def test_group_is_an_alias_of_agent() -> None:
    quick = build_parser().parse_args(
        ["change", "submit", "--kind", "persona", "--group", "dev-agent", "--by", "alice"]
    )
    assert (quick.agent, quick.by) == ("dev-agent", "alice")
    plain = build_parser().parse_args(["change", "submit", "--kind", "tools", "--agent", "x"])
    assert (plain.agent, plain.by) == ("x", None)


@pytest.mark.parametrize(
    ("asserted", "matches"),
    [("alice", True), ("1000", True), (" alice ", True), ("bob", False), ("0", False),
     ("root", False), ("Alice", False), ("", False), ("uid1000", False)],
)  # fmt: skip
def test_by_matches_only_the_callers_name_or_uid(asserted: str, matches: bool) -> None:
    assert asserted_caller_matches(asserted, 1000, "alice") is matches


def test_by_matching_the_caller_submits(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["change", "submit", "--kind", "persona", "--group", "demo", "--by", "alice",
            "--persona", "Terse."]  # fmt: skip
    assert main(argv) == exitcodes.OK
    (request,) = sent("SubmitChange")
    assert (request.agent, json.loads(request.payload_json)) == ("demo", {"persona": "Terse."})
    assert "alice" not in request.SerializeToString().decode(errors="replace")


@pytest.mark.parametrize("verb", ["submit", "approve"])
def test_by_naming_someone_else_is_refused_and_nothing_is_sent(
    verb: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = (["change", "submit", "--kind", "persona", "--agent", "demo", "--persona", "x"]
            if verb == "submit" else ["change", "approve", "c1", "--yes"])  # fmt: skip
    assert main([*argv, "--by", "bob"]) == exitcodes.PERMISSION
    err = capsys.readouterr().err
    assert "--by bob: the daemon sees you as uid 1000 (alice), not bob" in err
    assert "identity comes from the kernel (SO_PEERCRED" in err
    assert [name for name, _ in Stub.calls] == ["GetStatus"]


def test_a_persona_change_without_a_persona_off_a_terminal_names_what_is_missing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--json", "change", "submit", "--kind", "persona", "--group", "demo", "--by", "alice"]
    assert main(argv) == exitcodes.USAGE
    error = json.loads(capsys.readouterr().out)["error"]
    assert (
        "--persona-file FILE, --persona - (standard input) or --persona TEXT" in (error["message"])
    )
    assert Stub.calls == []


def test_persona_from_standard_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"From stdin.")))
    argv = ["change", "submit", "--kind", "persona", "--agent", "demo", "--persona", "-"]
    assert main(argv) == exitcodes.OK
    assert json.loads(sent("SubmitChange")[0].payload_json) == {"persona": "From stdin."}


def test_persona_and_persona_file_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["change", "submit", "--kind", "persona", "--agent", "d", "--persona", "x",
            "--persona-file", "f"]  # fmt: skip
    assert main(argv) == exitcodes.USAGE
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("original", "edited", "expected"),
    [
        ("Old.", "New.\n", "New."),
        ("Old.\n", "New.\n", "New.\n"),
        ("", "New.", "New."),
        ("Old.", "Old.\n\nMore.\n", "Old.\n\nMore."),
    ],
)
def test_an_edit_returns_the_new_text(original: str, edited: str, expected: str) -> None:
    written = original if original.endswith("\n") or not original else original + "\n"
    assert editor.edited_text(original, written, edited, "persona") == expected


@pytest.mark.parametrize(
    ("original", "edited", "why"),
    [("Old.", "Old.\n", "unchanged"), ("Old.\n", "Old.\n", "unchanged"),
     ("Old.", "", "empty"), ("Old.", " \n\t\n", "empty")],
)  # fmt: skip
def test_an_unchanged_or_empty_edit_submits_nothing(original: str, edited: str, why: str) -> None:
    written = original if original.endswith("\n") else original + "\n"
    with pytest.raises(CtlError) as info:
        editor.edited_text(original, written, edited, "persona of demo")
    assert str(info.value) == f"persona of demo is {why}: nothing submitted".replace(
        "is unchanged", "unchanged"
    )
    assert info.value.exit_code == exitcodes.FAILED


def test_the_editor_is_visual_then_editor_then_a_clear_error() -> None:
    both = {"VISUAL": "code --wait", "EDITOR": "vi"}
    assert editor.editor_command(both) == ["code", "--wait"]
    assert editor.editor_command({"VISUAL": " ", "EDITOR": "vi"}) == ["vi"]
    with pytest.raises(CtlError, match="no editor: set VISUAL or EDITOR"):
        editor.editor_command({})
