"""The ``mcp`` change kind (ironclawd/domain/kinds/mcp.py): what a registration may name, who may
ask for it, what the approver sees (credential names, never values), and grants pinned to the
definition the approver saw."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.changes import agent_view, canonical, check_payload, parse_change
from ironclawd.domain.kinds.mcp import KIND, tool_def
from ironclawd.domain.mcp import McpGrant
from ironclawd.domain.skills import AgentSkill, SkillFile, SkillGrants
from ironclawd.errors import Conflict, InvalidArgument, PolicyDenied

SCHEMA = {"type": "object", "properties": {"timezone": {"type": "string"}}}
SERVER: dict[str, Any] = {
    "name": "time",
    "command": ["/opt/mcp/bin/mcp-server-time", "--local-timezone", "UTC"],
    "env": {"TZ": "UTC"},
    "credentials": {"API_TOKEN": "time-token"},
    "allow": ["api.example.com:443"],
    "tools": [
        {"name": "get_current_time", "description": "Now.", "input_schema": SCHEMA},
        {"name": "convert_time", "description": "Convert.", "input_schema": {"type": "object"}},
    ],
}


def _register(**changes: Any) -> dict[str, Any]:
    return {"op": "register", "server": {**SERVER, **changes}}


def _apply(spec: AgentSpec, payload: dict[str, Any]) -> AgentSpec:
    return parse_change("mcp", spec.name, json.dumps(payload)).apply(spec)


def test_register_round_trips_and_the_view_shows_command_env_network_tools_not_secrets() -> None:
    dumped = check_payload("mcp", "demo", json.dumps(_register()))
    assert KIND.parse(dumped) == KIND.parse(_register())
    spec = _apply(AgentSpec("demo"), _register())
    (server,) = agent_view(spec)["mcp_servers"]  # type: ignore[index]
    assert server["command"] == SERVER["command"]
    assert server["env"] == {"TZ": "UTC"}
    assert server["credentials"] == {"API_TOKEN": "<host credential time-token>"}
    assert server["network"] == ["api.example.com:443"]
    assert [t["name"] for t in server["tools"]] == ["convert_time", "get_current_time"]
    assert json.loads(server["tools"][1]["input_schema"]) == SCHEMA
    # A server without `allow` shows that it has no network at all.
    bare = _apply(AgentSpec("demo"), _register(allow=[], credentials={}))
    assert agent_view(bare)["mcp_servers"][0]["network"] == "none"  # type: ignore[index]


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"command": ["mcp-server-time"]}, r"command\[0\]: expected an absolute"),
        ({"command": ["/opt/../bin/sh"]}, r"command\[0\]: expected an absolute, normalised"),
        ({"command": []}, "expected an argv of 1 to"),
        ({"command": ["/bin/x", "a\0b"]}, "without NUL"),
        ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "LD_PRELOAD may not be set"),
        ({"env": {"PYTHONPATH": "/tmp"}}, "PYTHONPATH may not be set"),
        ({"env": {"lower": "x"}}, "expected an environment name"),
        ({"credentials": {"TOKEN": "Not A Name"}}, "expected a host credential name"),
        ({"allow": ["example.com"]}, "expected HOST:PORT"),
        ({"allow": ["example.com:0"]}, "expected HOST:PORT"),
        ({"url": "https://mcp.example.com/"}, r"a remote server \(url\) has no command"),
        ({"name": "Bad_Name"}, "expected a server name"),
        ({"tools": [{"name": "a b", "description": "", "input_schema": {}}]}, "MCP tool name"),
        ({"shell": True}, r"unexpected key\(s\) shell"),
    ],
)
def test_a_registration_is_refused_field_by_field(server: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        check_payload("mcp", "demo", json.dumps(_register(**server)))


def test_only_an_operator_may_register_a_server_a_session_may_ask_for_grants() -> None:
    register = parse_change("mcp", "demo", json.dumps(_register()))
    register.authorize("uid:0")
    with pytest.raises(PolicyDenied, match="only come from an operator"):
        register.authorize("session:abcd1234")
    grant = parse_change("mcp", "demo", json.dumps({"op": "grant", "server": "time", "tools": []}))
    grant.authorize("session:abcd1234")
    parse_change("mcp", "demo", '{"op": "unregister", "server": "time"}').authorize(
        "session:abcd1234"
    )


def test_a_grant_is_pinned_to_the_registered_definition_and_replaces_the_servers_grants() -> None:
    spec = _apply(AgentSpec("demo"), _register())
    granted = _apply(spec, {"op": "grant", "server": "time", "tools": ["get_current_time"]})
    (grant,) = granted.mcp_grants
    shown = tool_def("get_current_time", "Now.", SCHEMA)
    assert (grant.server, grant.tool, grant.digest) == ("time", "get_current_time", shown.digest)
    assert agent_view(granted)["mcp_grants"][0]["tool"] == "mcp__time__get_current_time"  # type: ignore[index]
    # The same definition with another description has another pin.
    assert tool_def("get_current_time", "Now!", SCHEMA).digest != grant.digest
    both = _apply(granted, {"op": "grant", "server": "time", "tools": ["convert_time"]})
    assert [g.tool for g in both.mcp_grants] == ["convert_time"]
    revoked = _apply(both, {"op": "grant", "server": "time", "tools": []})
    assert revoked.mcp_grants == ()


def test_a_grant_names_only_tools_the_registered_server_offers() -> None:
    spec = _apply(AgentSpec("demo"), _register())
    with pytest.raises(Conflict, match="offers no tool delete_all"):
        _apply(spec, {"op": "grant", "server": "time", "tools": ["delete_all"]})
    with pytest.raises(Conflict, match="'git' is not registered for agent 'demo'"):
        _apply(spec, {"op": "grant", "server": "git", "tools": ["git_log"]})
    dotted = _apply(AgentSpec("demo"), _register(tools=[{"name": "a.b", "description": ""}]))
    with pytest.raises(Conflict, match="cannot be offered to a model"):
        _apply(dotted, {"op": "grant", "server": "time", "tools": ["a.b"]})


def test_unregister_drops_the_server_and_its_grants_only() -> None:
    spec = _apply(AgentSpec("demo"), _register())
    spec = _apply(spec, _register(name="other"))
    spec = _apply(spec, {"op": "grant", "server": "time", "tools": ["convert_time"]})
    spec = _apply(spec, {"op": "grant", "server": "other", "tools": ["convert_time"]})
    after = _apply(spec, {"op": "unregister", "server": "time"})
    assert [s.name for s in after.mcp_servers] == ["other"]
    assert [(g.server, g.tool) for g in after.mcp_grants] == [("other", "convert_time")]
    with pytest.raises(Conflict, match="not registered"):
        _apply(after, {"op": "unregister", "server": "time"})


def test_a_server_whose_tools_a_skill_grants_is_not_unregistered_under_it() -> None:
    # The skill's grants outlived the server, unseen, and came back with a server registered
    # again under the name (found by a review).
    spec = _apply(AgentSpec("demo"), _register())
    pin = spec.mcp_servers[0].tools[0]
    files = (SkillFile("SKILL.md", "0" * 64, "x"),)
    grants = SkillGrants(mcp_tools=(McpGrant("time", pin.name, pin.digest),))
    skill = AgentSkill("gh", "1", "d", "0" * 16, "0" * 64, files, grants)
    with pytest.raises(Conflict, match=r"granted by skill.*gh.*remove them first"):
        _apply(dataclasses.replace(spec, skills=(skill,)), {"op": "unregister", "server": "time"})


def test_an_agent_without_mcp_keeps_the_view_older_changes_recorded() -> None:
    assert "mcp_servers" not in canonical(agent_view(AgentSpec("demo")))
    with pytest.raises(
        InvalidArgument, match=r"payload\.op: expected register, unregister or grant"
    ):
        check_payload("mcp", "demo", '{"op": "install"}')
