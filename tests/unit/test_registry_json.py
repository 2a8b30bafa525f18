"""The registry stores agents as JSON: every field, nested values included, survives the trip."""

from __future__ import annotations

from ironclawd.domain.agents import AgentMount, AgentSpec
from ironclawd.domain.egress import rule_from_mapping
from ironclawd.domain.mcp import McpGrant, McpServer, McpToolDef
from ironclawd.domain.skills import AgentSkill, SkillFile, SkillGrants
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
