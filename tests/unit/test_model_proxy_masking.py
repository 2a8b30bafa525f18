"""What ModelProxy masks in what returns: the calling agent's own credentials, and no other
agent's. The agent controls what its model repeats, so masking a value it guessed tells it the
guess was right: masking every credential on the host made the proxy an oracle for all of them."""

from __future__ import annotations

import asyncio

from ironclawd.domain.agents import AgentSpec, own_credentials
from ironclawd.domain.egress import EgressRule
from ironclawd.domain.mcp import McpServer
from ironclawd.domain.model import Message
from ironclawd.domain.skills import AgentSkill, SkillGrants
from ironclawd.providers.mock import MockProvider
from ironclawd.services.model_proxy import ModelProxy
from tests.fakes import FakeClock, FakeCredentials, RecordingAudit, StaticSessions

KEY = "sk-unit-CANARY-5f3a9c0e7b"


def test_own_credentials_are_the_model_key_egress_rules_skills_and_mcp_servers() -> None:
    grants = SkillGrants(egress=(EgressRule("b.test", credential="skill-token"),))
    skill = AgentSkill("s", "1", "d", "0" * 16, "0" * 64, (), grants)
    spec = AgentSpec(
        "a",
        credential="model-key",
        egress=(EgressRule("a.test", credential="rule-token"), EgressRule("open.test")),
        skills=(skill,),
        mcp_servers=(
            McpServer("remote", url="https://mcp.test/", credentials=(("X-Key", "mcp-key"),)),
            McpServer("local", command=("srv",), credentials=(("API_TOKEN", "env-key"),)),
        ),
    )
    assert own_credentials(spec) == {
        "model-key", "rule-token", "skill-token", "mcp-key", "env-key",
    }  # fmt: skip
    assert own_credentials(AgentSpec("bare")) == frozenset()


def test_another_agents_credential_is_not_masked_so_guesses_learn_nothing() -> None:
    spec = AgentSpec("a", provider="mock", credential="upstream",
                     egress=(EgressRule("a.test", credential="a-pin"),))  # fmt: skip
    proxy = ModelProxy(
        sessions=StaticSessions(sess0001="a"),
        agents={"a": spec, "b": AgentSpec("b", egress=(EgressRule("b.test", credential="b-pin"),))},
        providers={"mock": MockProvider()},  # it answers "mock: " and the message
        credentials=FakeCredentials(upstream=KEY, **{"a-pin": "7311", "b-pin": "4821"}),
        base_urls={},
        audit=RecordingAudit(),
        clock=FakeClock(1000.0),
    )
    guesses = " ".join(f"{i:04d}" for i in range(4800, 4830)) + f" 7311 {KEY}"

    async def go() -> str:
        chunks = proxy.complete("sess0001", [Message("user", guesses)], [], 0)
        return "".join([c.text async for c in chunks])

    answer = asyncio.run(go()).removeprefix("mock: ").split(" ")
    assert answer[:-2] == guesses.split(" ")[:-2]  # b's "4821" among them, as it was sent
    assert answer[-2:] == ["[REDACTED]", "[REDACTED]"]  # a's own egress credential and key
