"""``ironctl wiring list|show`` and ``ironctl permissions show`` against a stub daemon: every
field present in JSON (defaults filled in), tables escaped (a pattern's brackets and a hostile
identity are text, never terminal markup or escapes)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, rpc
from ironclawd.ctl.main import main

DEMO_VIEW = {
    "name": "demo",
    "wiring": [
        {"channel": "chat", "where": "!r:x.org", "engage": "pattern", "pattern": "[red]x[/red]"},
        {"channel": "hooks", "where": "ci", "reply_url": "https://ci.example/r"},
    ],
    "permissions": {
        "allow": ["chat:@eve\u202e:x", "user:alice"],
        "unknown": "hold",
        "approvers": {"wiring": "netops"},
    },
}
AGENTS = [
    admin_pb2.Agent(name="demo", view_json=json.dumps(DEMO_VIEW)),
    admin_pb2.Agent(name="quiet", view_json=json.dumps({"name": "quiet"})),
]


class Stub:
    def __init__(self, channel: Any) -> None:
        pass

    def ListAgents(self, request: Any, timeout: float) -> admin_pb2.ListAgentsResponse:
        return admin_pb2.ListAgentsResponse(agents=AGENTS)

    def GetAgent(self, request: Any, timeout: float) -> admin_pb2.GetAgentResponse:
        return admin_pb2.GetAgentResponse(agent=next(a for a in AGENTS if a.name == request.name))


@pytest.fixture(autouse=True)
def stub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "stub_for", Stub)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == exitcodes.OK
    return capsys.readouterr().out


def test_wiring_list_and_show_in_json_have_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    routes = json.loads(run(capsys, "wiring", "list", "--json"))["routes"]
    assert routes == [
        {"agent": "demo", "channel": "chat", "where": "!r:x.org", "engage": "pattern",
         "pattern": "[red]x[/red]", "sessions": "per_sender", "reply_url": ""},
        {"agent": "demo", "channel": "hooks", "where": "ci", "engage": "always", "pattern": "",
         "sessions": "per_sender", "reply_url": "https://ci.example/r"},
    ]  # fmt: skip
    assert json.loads(run(capsys, "wiring", "show", "quiet", "--json")) == {
        "agent": "quiet", "routes": []}  # fmt: skip


def test_permissions_show_fills_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert json.loads(run(capsys, "permissions", "show", "quiet", "--json")) == {
        "agent": "quiet", "allow": [], "unknown": "drop", "approvers": {}}  # fmt: skip
    doc = json.loads(run(capsys, "permissions", "show", "demo", "--json"))
    assert doc["approvers"] == {"wiring": "netops"}


def test_tables_show_hostile_text_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    shown = run(capsys, "wiring", "show", "demo")
    assert "pattern [red]x[/red]" in shown  # markup printed, not applied
    assert "https://ci.example/r" in shown
    perms = run(capsys, "permissions", "show", "demo")
    assert "\u202e" not in perms
    assert "chat:@eve\\u202e:x" in perms
    assert "only user:alice" in perms
    assert "wiring: group netops" in perms
    assert "is wired to no channel" in run(capsys, "wiring", "show", "quiet")
    assert "any ironclaw-admin member" in run(capsys, "permissions", "show", "quiet")
