"""An approved change's restart marks each session it restarts until it runs again
(``Session.restarting``, f0d3fda); the admin API's Session and ``ironctl session list/show`` did
not carry the mark, so a session a cut restart left stopped, which the next daemon start starts
again, showed as a plain stopped one (an operator could not tell the two apart)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.api.admin import session_to_proto
from ironclawd.ctl import exitcodes, rpc
from ironclawd.ctl.main import main
from ironclawd.domain.session import Session, State

NO_DAEMON = ["--socket", "/nonexistent/ironclaw-admin.sock"]
DOC = Path(__file__).parents[2] / "docs" / "ironctl-json.md"
MARKED = admin_pb2.Session(sid="abcdefgh0010", agent="demo", state=admin_pb2.SESSION_STATE_STOPPED,
                           created_at=100.0, restarting=True)  # fmt: skip
PLAIN = admin_pb2.Session(sid="abcdefgh0011", agent="demo", state=admin_pb2.SESSION_STATE_STOPPED,
                          created_at=100.0)  # fmt: skip


class Stub:
    def __init__(self, channel: Any) -> None:
        pass

    def ListSessions(self, request: Any, timeout: float) -> admin_pb2.ListSessionsResponse:
        return admin_pb2.ListSessionsResponse(sessions=[MARKED, PLAIN])

    def GetSession(self, request: Any, timeout: float) -> admin_pb2.GetSessionResponse:
        return admin_pb2.GetSessionResponse(session=MARKED if request.sid == MARKED.sid else PLAIN)


@pytest.fixture(autouse=True)
def stub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "stub_for", Stub)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main([*argv, *NO_DAEMON]) == exitcodes.OK
    return capsys.readouterr().out


def test_the_api_carries_the_restarts_mark() -> None:
    left = Session("abcdefgh0010", "demo", State.STOPPED, 1.0, 2.0, 1.0, restarting=True)
    shown = session_to_proto(left)
    assert shown.restarting  # before: no such field, and the session a plain stopped one
    assert shown.state == admin_pb2.SESSION_STATE_STOPPED
    assert shown.error == ""
    assert not session_to_proto(Session("abcdefgh0011", "demo", State.STOPPED, 1.0, 2.0, 1.0)
                                ).restarting  # fmt: skip


def test_session_list_says_which_stopped_session_a_restart_marks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = run(capsys, "session", "list").splitlines()
    marked = next(line for line in lines if "abcdefgh0010" in line)
    plain = next(line for line in lines if "abcdefgh0011" in line)
    assert "stopped (restarting)" in marked
    assert "restarting" not in plain


def test_session_show_says_so_in_a_line_of_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "session", "show", "abcdefgh0010")
    assert re.search(r"state\s+stopped \(restarting\)", out), out
    assert re.search(r"restarting\s+an approved change's restart", out), out
    assert "restarting" not in run(capsys, "session", "show", "abcdefgh0011")


def test_json_has_the_field_for_every_session(capsys: pytest.CaptureFixture[str]) -> None:
    listed = json.loads(run(capsys, "session", "list", "--json"))["sessions"]
    assert [s["restarting"] for s in listed] == [True, False]
    assert json.loads(run(capsys, "session", "show", "abcdefgh0010", "--json"))["restarting"]


def test_the_json_doc_names_every_field_of_a_session() -> None:
    row = next(line for line in DOC.read_text(encoding="utf-8").splitlines()
               if line.startswith("| session |"))  # fmt: skip
    named = set(re.findall(r"`([a-z_]+)`", row))
    missing = sorted(set(admin_pb2.Session.DESCRIPTOR.fields_by_name) - named)
    assert not missing, f"docs/ironctl-json.md: a session also has {missing}"
