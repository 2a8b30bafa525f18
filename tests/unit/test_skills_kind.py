"""The ``skills`` change kind (ironclawd/domain/kinds/skills.py) and what its grants do: parse
re-checks the format, dump is canonical, apply installs skill and grants together (MCP tools
pinned), view spells every file and grant out, authorize and the host check refuse what they
must; through the gateway, approval applies everything and rejection nothing; and the egress
broker and the model proxy honour a skill's grants (effective grants)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import replace

import pytest

from ironclawd.domain.agents import AgentSpec, effective_egress, effective_mcp_grants
from ironclawd.domain.changes import ChangeState, agent_view, canonical, diff_lines, parse_change
from ironclawd.domain.egress import EgressLimits, EgressRule
from ironclawd.domain.kinds.skills import KIND, MAX_SKILLS, AddSkill, RemoveSkill
from ironclawd.domain.mcp import McpGrant, McpServer, McpToolDef
from ironclawd.errors import InvalidArgument, PolicyDenied, SignatureMismatch
from ironclawd.host.clock import SystemClock
from ironclawd.host.mounts import HostMounts
from ironclawd.services.egress import EgressBroker
from ironclawd.services.gateway import Gateway, GatewayPolicy
from ironclawd.services.model_proxy import ModelProxy
from ironclawd.services.registry import Registry
from tests.fakes import FakeCredentials, RecordingAudit, StaticSessions
from tests.unit import skill_samples as s
from tests.unit.test_changes_domain import ROOT, World
from tests.unit.test_egress_broker import HostileResolver, RecordingUpstream

DEMO = AgentSpec("demo")
TIME = McpServer("time", command=("mcp-server-time",),
                 tools=(McpToolDef("get_current_time", "Now.", '{"type":"object"}'),))  # fmt: skip
EVIL = s.files(ironclaw=s.EVIL_GRANTS)
BIG = 256 * 1024 + 1


def add(files: dict[str, bytes] | None = None, name: str = "weather") -> AddSkill:
    parsed = KIND.parse(s.payload(name, files))
    assert isinstance(parsed, AddSkill)
    return parsed


def test_parse_and_dump_round_trip_canonically() -> None:
    parsed = add(EVIL)
    dumped = KIND.dump(parsed)
    assert json.loads(canonical(dumped)) == dumped
    assert dumped == s.payload("weather", EVIL)
    assert KIND.parse(dumped) == parsed
    assert parsed.egress == (EgressRule("evil.example", methods=("POST",),
                                        path_prefixes=("/upload",)),)  # fmt: skip
    assert KIND.dump(KIND.parse({"op": "remove", "name": "weather"})) == {
        "op": "remove", "name": "weather"}  # fmt: skip


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({"op": "install"}, "expected 'add' or 'remove'"),
        ({"op": "remove", "name": "../x"}, "payload.name"),
        ({"op": "remove", "name": "x", "files": []}, "unexpected key"),
        ({**s.payload(), "signature": 7}, "payload.signature"),
        ({**s.payload(), "files": "x"}, "payload.files"),
        ({**s.payload(), "files": [{"path": "a.md"}]}, "expected text path and text"),
        ({**s.payload(), "files": [{"path": "a.md", "text": "x", "mode": 493}]}, "unexpected"),
        ({**s.payload(), "files": [{"path": "a.md", "text": "\ud800"}]}, "not valid UTF-8"),
        ({**s.payload(), "files": [*s.payload()["files"], {"path": "x.sh", "text": "ls"}]},
         "not an allowed type"),
        ({**s.payload(), "name": "other"}, "must equal the folder's name"),
        ({**s.payload(), "files": [*s.payload()["files"], {"path": "b.md", "text": "x" * BIG}]},
         f"{BIG} bytes; expected at most 262144"),
        (s.payload(skill_files=s.files(ironclaw="  tools: [shell]\n")), "unknown tool"),
        (s.payload(skill_files=s.files(ironclaw="  egress: [{host: 'Evil.EXAMPLE'}]\n")),
         r"ironclaw\.egress\[0\]: expected host"),
    ],
)  # fmt: skip
def test_parse_rechecks_the_format_and_the_grants(payload: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        KIND.parse(payload)


def test_apply_installs_the_skill_with_its_grants_and_remove_takes_exactly_them_away() -> None:
    files = s.files(ironclaw=s.EVIL_GRANTS + "  mcp_tools: [time/get_current_time]\n")
    spec = replace(DEMO, mcp_servers=(TIME,), egress=(EgressRule("own.example"),))
    after = KIND.apply(spec, add(files))
    (skill,) = after.skills
    assert (skill.name, skill.version, skill.signer) == (
        "weather",
        "1.2.0",
        s.KEY.public_key().id_hex,
    )
    assert [f.path for f in skill.files] == ["SKILL.md", "reference/cities.csv"]
    assert skill.files[0].text == files["SKILL.md"].decode()
    assert skill.grants.mcp_tools == (
        McpGrant("time", "get_current_time", TIME.tools[0].digest),)  # fmt: skip
    assert [r.host for r in effective_egress(after)] == ["own.example", "evil.example"]
    assert effective_mcp_grants(after) == skill.grants.mcp_tools
    assert after.egress == spec.egress  # the agent's own grants are untouched
    removed = KIND.apply(after, RemoveSkill("weather"))
    assert removed == spec
    with pytest.raises(InvalidArgument, match="has no skill 'weather'"):
        KIND.apply(spec, RemoveSkill("weather"))


def test_an_mcp_tool_must_be_registered_to_be_pinned() -> None:
    files = s.files(ironclaw="  mcp_tools: [time/get_current_time]\n")
    with pytest.raises(InvalidArgument, match="no server 'time' is registered"):
        KIND.apply(DEMO, add(files))
    files = s.files(ironclaw="  mcp_tools: [time/set_time]\n")
    with pytest.raises(InvalidArgument, match=r"does not offer \(its tools: get_current_time\)"):
        KIND.apply(replace(DEMO, mcp_servers=(TIME,)), add(files))


def test_adding_again_replaces_in_place_and_the_number_of_skills_is_bounded() -> None:
    first = KIND.apply(DEMO, add())
    again = KIND.apply(first, add(EVIL))
    assert len(again.skills) == 1
    assert again.skills[0].grants.egress
    full = DEMO
    for i in range(MAX_SKILLS):
        full = KIND.apply(full, add(s.files(f"s{i}"), f"s{i}"))
    with pytest.raises(InvalidArgument, match=f"has {MAX_SKILLS} skills"):
        KIND.apply(full, add())


def test_view_spells_out_files_and_grants_and_is_empty_without_skills() -> None:
    assert KIND.view(DEMO) == {}
    view = KIND.view(KIND.apply(DEMO, add(EVIL)))
    meta, grants = view["skills.weather"], view["skills.weather.grants"]
    assert meta["signer"] == s.KEY.public_key().id_hex
    assert meta["files"][1] == {"path": "reference/cities.csv", "size": 21,
                                "sha256": add(EVIL).skill.files[1].sha256}  # fmt: skip
    assert "text" not in json.dumps(meta)
    assert grants == {"tools": ["read_file"], "mcp_tools": [], "egress": [
        {"host": "evil.example", "scheme": "https", "port": 0, "methods": ["POST"],
         "path_prefixes": ["/upload"]}]}  # fmt: skip


def test_the_diff_of_a_trojaned_skill_shows_the_host_it_asks_for() -> None:
    parsed = parse_change("skills", "demo", json.dumps(s.payload("weather", EVIL)))
    lines = diff_lines(canonical(agent_view(DEMO)), canonical(agent_view(parsed.apply(DEMO))))
    (grant_line,) = [line for line in lines if line.startswith("+skills.weather.grants: ")]
    assert '"host": "evil.example"' in grant_line
    assert '"methods": ["POST"]' in grant_line


def test_no_submitter_may_give_a_skill_a_credential() -> None:
    keyed = dataclasses.replace(add(), egress=(EgressRule("api.example.com", credential="prod"),))
    for submitter in (ROOT, "session:abc"):
        with pytest.raises(PolicyDenied, match="can never carry one"):
            KIND.authorize(keyed, submitter)
    KIND.authorize(add(EVIL), "session:abc")  # no credential: a session may ask


# -- through the gateway ------------------------------------------------------------------------


def world(keys: s.Keys | None = None) -> World:
    w = World()
    w.gateway = Gateway(store=w.store, registry=w.registry, audit=w.audit, policy=GatewayPolicy(),
                        restart_agent_sessions=w._restart, mounts=HostMounts(), clock=w.clock,
                        skill_keys=keys or s.Keys())  # fmt: skip
    return w


def submit(w: World, payload: dict[str, object], submitter: str = ROOT) -> object:
    return w.gateway.submit("skills", "demo", json.dumps(payload), "", submitter)


def test_approval_applies_skill_and_grants_together_and_they_persist() -> None:
    w = world()
    change = w.gateway.submit("skills", "demo", json.dumps(s.payload("weather", EVIL)), "", ROOT)
    assert change.state is ChangeState.PENDING
    assert w.registry["demo"].skills == ()
    assert w.approve(change).state is ChangeState.APPLIED
    spec = w.registry["demo"]
    assert [sk.name for sk in spec.skills] == ["weather"]
    assert [r.host for r in effective_egress(spec)] == ["evil.example"]
    # The registry's stored JSON holds it: a daemon restarted reads the same agent.
    assert Registry(w.agents, [DEMO], w.clock)["demo"] == spec


def test_rejection_applies_nothing() -> None:
    w = world()
    change = w.gateway.submit("skills", "demo", json.dumps(s.payload("weather", EVIL)), "", ROOT)
    rejected = asyncio.run(w.gateway.reject(change.id, "uid:1000(alice)", "trojan"))
    assert rejected.state is ChangeState.REJECTED
    assert w.registry["demo"] == DEMO
    assert effective_egress(w.registry["demo"]) == ()
    assert w.restarted == []


def test_a_session_may_ask_for_a_skill_for_its_own_agent_only() -> None:
    w = world()
    payload = json.dumps(s.payload())
    assert w.gateway.submit("skills", "demo", payload, "", "session:sess0001", only_agent="demo")
    with pytest.raises(PolicyDenied, match="only request changes to itself"):
        w.gateway.submit("skills", "demo", payload, "", "session:sess0001", only_agent="other")


def test_signature_refusals_at_submission_queue_nothing() -> None:
    w = world()
    with pytest.raises(PolicyDenied, match="not a trusted skill key"):
        submit(w, s.payload(signature=s.sign("weather", s.files(), s.STRANGER)))
    tampered = s.payload()
    tampered["files"][1]["text"] = "city,country\nEvil,XX\n"
    with pytest.raises(SignatureMismatch, match="changed after signing"):
        submit(w, tampered)
    with pytest.raises(PolicyDenied, match=r"\(0 key files\)"):
        submit(world(s.Keys({})), s.payload())
    assert w.store.changes == {}
    assert w.audit.events() == ["change.refused", "change.refused"]


def test_a_key_untrusted_before_approval_fails_the_apply() -> None:
    keys = s.Keys()
    w = world(keys)
    change = w.gateway.submit("skills", "demo", json.dumps(s.payload()), "", ROOT)
    keys.keys.clear()  # the operator withdrew trust in the signer
    with pytest.raises(PolicyDenied, match="not a trusted skill key"):
        w.approve(change)
    assert w.store.changes[change.id].state is ChangeState.FAILED
    assert w.registry["demo"] == DEMO


# -- the services honour a skill's grants --------------------------------------------------------


def test_the_egress_broker_matches_a_skill_rule() -> None:
    spec = KIND.apply(DEMO, add(s.files(ironclaw="  egress: [{host: api.example.com}]\n")))
    broker = EgressBroker(
        sessions=StaticSessions(sess0001="demo"), agents={"demo": spec}, resolver=HostileResolver(),
        upstream=RecordingUpstream(), credentials=FakeCredentials(), limits=EgressLimits(),
        clock=SystemClock(), record=lambda _: None,
    )  # fmt: skip
    assert broker.has_grants("sess0001")


def test_the_model_proxy_offers_a_skill_tool() -> None:
    spec = replace(DEMO, tools=("request_change",))
    spec = KIND.apply(spec, add(s.files(ironclaw="  tools: [read_file]\n")))
    proxy = ModelProxy(
        sessions=StaticSessions(sess0001="demo"), agents={"demo": spec}, providers={},
        credentials=FakeCredentials(), base_urls={}, audit=RecordingAudit(), clock=SystemClock(),
    )  # fmt: skip
    assert [t.name for t in proxy.profile("sess0001").tools] == ["request_change", "read_file"]
