"""The registry stores agents as JSON: every field, nested values included, survives the trip."""

from __future__ import annotations

import json

import pytest

from ironclawd.domain.agents import AgentMount, AgentSpec
from ironclawd.domain.egress import rule_from_mapping
from ironclawd.domain.mcp import McpGrant, McpServer, McpToolDef
from ironclawd.domain.skills import AgentSkill, SkillFile, SkillGrants
from ironclawd.errors import HostError
from ironclawd.services.registry import spec_from_json, spec_to_json


def test_every_nested_value_round_trips() -> None:
    rule = rule_from_mapping({"scheme": "https", "host": "api.example.com", "port": 443})
    skill = AgentSkill(
        name="notes", version="1.0", description="Keep notes", signer="ab" * 8,
        manifest_sha256="00" * 32, files=(SkillFile("SKILL.md", "11" * 32, "body"),),
        grants=SkillGrants(("read_file",), (rule,), (McpGrant("time", "now", "ee" * 32),)),
    )  # fmt: skip
    server = McpServer(
        "time", ("/usr/bin/mcp-server-time", "--local-timezone", "UTC"), env=(("A", "b"),),
        credentials=(("TOKEN", "gh"),), allow=("api.example.com:443",),
        tools=(McpToolDef("now", "The time", '{"type":"object"}'),),
    )  # fmt: skip
    spec = AgentSpec(
        "a", egress=(rule,), mounts=(AgentMount("m", "/srv/m"),), skills=(skill,),
        mcp_servers=(server,), mcp_grants=(McpGrant("time", "now", "ff" * 32),),
    )  # fmt: skip
    assert spec_from_json(spec_to_json(spec)) == spec


def test_an_agent_stored_before_skills_and_mcp_reads_with_none() -> None:
    old = '{"name": "a", "tools": ["read_file"]}'
    spec = spec_from_json(old)
    assert (spec.skills, spec.mcp_servers, spec.mcp_grants) == ((), (), ())


def test_fields_a_newer_version_added_are_refused_not_dropped() -> None:
    """After a downgrade the registry holds records a newer ironclawd wrote: a field this
    version does not know (at the top or nested) would be ignored, then lost when the agent is
    next written. Reading such a record fails, naming the field."""
    stored = json.loads(spec_to_json(AgentSpec("a", mounts=(AgentMount("m", "/srv/m"),))))
    newer = {**stored, "max_tool_seconds": 30}
    with pytest.raises(HostError, match=r"agent 'a' in the registry: max_tool_seconds not known"):
        spec_from_json(json.dumps(newer))
    newer = {**stored, "permissions": {**stored["permissions"], "deny": ["matrix:@x:y"]}}
    with pytest.raises(HostError, match=r"permissions\.deny not known to this ironclawd"):
        spec_from_json(json.dumps(newer))
    newer = {**stored, "mounts": [{**stored["mounts"][0], "exec": True}]}
    with pytest.raises(HostError, match=r"agent 'a' in the registry: a record this ironclawd "
                       r"cannot read .*exec"):  # fmt: skip
        spec_from_json(json.dumps(newer))
