"""Four-eyes and an agent's approver groups are keyed by change kind, and a signed skill grants
tools, egress and MCP tools too: with four-eyes on egress, a submitter could not approve her own
egress rule but could approve the same rule brought by a skill; an egress approver group was
passed the same way (found by a review). The rules now hold for every kind a change amounts
to: its own and each whose effective grants it changes."""

from __future__ import annotations

import asyncio
import json

import pytest

from ironclawd.domain.agents import AgentSpec, effective_egress
from ironclawd.domain.changes import ChangeState, effect_kinds
from ironclawd.domain.channels import Permissions
from ironclawd.errors import Conflict, PolicyDenied
from ironclawd.host.mounts import HostMounts
from ironclawd.services.gateway import Gateway, GatewayPolicy
from ironclawd.services.registry import Registry
from tests.fakes import FakeClock, FakeTrustedKeys, MemoryAgents, MemoryChanges, RecordingAudit
from tests.unit import skill_samples as samples

ALICE = "uid:1000(alice)"
BOB = "uid:1001(bob)"


def _gateway(spec: AgentSpec, policy: GatewayPolicy) -> tuple[Gateway, Registry]:
    clock = FakeClock(1000.0)
    registry = Registry(MemoryAgents(), [spec], clock)

    async def restart(agent: str) -> list[str]:
        return []

    gateway = Gateway(
        store=MemoryChanges(), registry=registry, audit=RecordingAudit(), policy=policy,
        restart_agent_sessions=restart, mounts=HostMounts(), clock=clock,
        skill_keys=FakeTrustedKeys(samples.TRUSTED),
    )  # fmt: skip
    return gateway, registry


def _skill(grants: str = samples.EVIL_GRANTS) -> str:
    files = samples.files("weather", ironclaw=grants)
    return json.dumps(samples.payload("weather", files, samples.sign("weather", files)))


def test_four_eyes_on_egress_holds_for_a_skill_that_brings_an_egress_rule() -> None:
    gateway, registry = _gateway(AgentSpec("demo"), GatewayPolicy(four_eyes=frozenset({"egress"})))
    change = gateway.submit("skills", "demo", _skill(), "", ALICE)
    with pytest.raises(Conflict, match=r"four-eyes.*egress"):
        asyncio.run(gateway.approve(change.id, change.hash, ALICE))
    assert effective_egress(registry["demo"]) == ()
    done = asyncio.run(gateway.approve(change.id, change.hash, BOB))
    assert done.state is ChangeState.APPLIED
    assert effective_egress(registry["demo"]) != ()


def test_an_egress_approver_group_decides_a_skill_that_brings_an_egress_rule() -> None:
    spec = AgentSpec("demo", permissions=Permissions(approvers=(("egress", "netadmins"),)))
    gateway, _ = _gateway(spec, GatewayPolicy())
    change = gateway.submit("skills", "demo", _skill(), "", "session:a2u5k8gguri5")
    with pytest.raises(PolicyDenied, match=r"netadmins.*also changes its egress"):
        asyncio.run(gateway.approve(change.id, change.hash, ALICE, frozenset({"ironclaw-admin"})))
    with pytest.raises(PolicyDenied, match="netadmins"):
        asyncio.run(gateway.reject(change.id, ALICE, "no", frozenset({"ironclaw-admin"})))
    done = asyncio.run(gateway.approve(change.id, change.hash, BOB, frozenset({"netadmins"})))
    assert done.state is ChangeState.APPLIED


def test_a_skill_without_grants_is_a_skills_change_only() -> None:
    gateway, _ = _gateway(AgentSpec("demo"), GatewayPolicy(four_eyes=frozenset({"egress"})))
    change = gateway.submit("skills", "demo", _skill(grants=""), "", ALICE)
    assert asyncio.run(gateway.approve(change.id, change.hash, ALICE)).state is (
        ChangeState.APPLIED
    )


def test_effect_kinds_names_every_grant_a_change_moves() -> None:
    before = AgentSpec("demo")
    assert effect_kinds("persona", before, AgentSpec("demo", persona="Other.")) == {"persona"}
    assert effect_kinds("create_agent", None, AgentSpec("new", tools=("read_file",))) == {
        "create_agent", "tools",
    }  # fmt: skip
    assert effect_kinds("create_agent", None, AgentSpec("new")) == {"create_agent"}
    with_tools = AgentSpec("demo", tools=("read_file",))
    assert effect_kinds("permissions", with_tools, with_tools) == {"permissions"}
