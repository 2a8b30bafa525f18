"""The registry of change kinds (ironclawd/domain/kinds/): every kind the protocol and the docs
name is registered; each kind round-trips parse -> dump -> parse, diffs only the fields it owns
and applies only them; and a kind defined here, registered here, goes through the domain and the
gateway end to end without any other file knowing it (a new kind is one module).
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import importlib
import json
import pkgutil
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

import ironclawd.domain.kinds as kinds_package
from ironclawd.config_keys import _kinds
from ironclawd.domain.agents import AgentMount, AgentSpec
from ironclawd.domain.changes import (
    KINDS,
    agent_view,
    canonical,
    check_payload,
    diff_lines,
    parse_change,
)
from ironclawd.domain.kinds import ChangeKind, HostChecks, RefusedKind
from ironclawd.domain.kinds.base import only
from ironclawd.errors import Conflict, InvalidArgument, PolicyDenied
from ironclawd.services.gateway import GatewayPolicy
from tests.unit import skill_samples
from tests.unit.test_changes_domain import ROOT, World

REPO = Path(__file__).resolve().parents[2]
DEMO = AgentSpec("demo")
SAMPLE_MOUNTS = (AgentMount("x", "/srv/x"),)

# One payload per kind that this ironclawd applies, changing DEMO.
SAMPLES: dict[str, dict[str, Any]] = {
    "persona": {"persona": "Be terse."},
    "tools": {"tools": ["read_file", "list_files", "read_file"]},
    "egress": {"rules": [{"host": "api.example.com", "methods": ["GET", "POST"]}]},
    "mounts": {"mounts": [{"source": "/srv/data", "name": "data", "read_only": False}]},
    "create_agent": {"persona": "You help.", "tools": ["read_file"], "provider": "anthropic"},
    "skills": skill_samples.payload(),
    "mcp": {"op": "register", "server": {"name": "time", "command": ["/usr/bin/mcp-time"]}},
    "wiring": {"routes": [{"channel": "chat", "where": "!room:example.org", "engage": "mention"}]},
    "permissions": {
        "allow": ["chat:@alice:example.org"],
        "unknown": "hold",
        "approvers": {"wiring": "wheel"},
    },
    # As stored: the names and the set the host resolved at submission.
    "packages": {
        "packages": ["jq"],
        "resolved": [
            {
                "name": "jq",
                "version": "1.6-2.1+deb12u3",
                "architecture": "amd64",
                "sha256": "a" * 64,
                "size": 64432,
                "requested": True,
            },
            {
                "name": "libjq1",
                "version": "1.6-2.1+deb12u3",
                "architecture": "amd64",
                "sha256": "b" * 64,
                "size": 135000,
                "requested": False,
            },
        ],
    },
}
# The view keys each kind may change when applied (create_agent makes the whole agent).
OWNS = {"persona": {"persona"}, "tools": {"tools"}, "egress": {"egress"}, "mounts": {"mounts"},
        "skills": {"skills.weather", "skills.weather.grants"}, "mcp": {"mcp_servers"},
        "packages": {"packages"}, "wiring": {"wiring"},
        "permissions": {"permissions"}}  # fmt: skip
# The AgentSpec fields each kind may change, where they are not its view keys.
FIELDS = {**OWNS, "skills": {"skills"}}


def _named(text: str) -> set[str]:
    return set(re.findall(r"`?([a-z_]+)`?", text))


def test_the_registry_holds_exactly_the_kinds_the_protocol_and_the_docs_name() -> None:
    proto = (REPO / "proto/ironclaw/gateway/v1/gateway.proto").read_text()
    listed = re.search(r"message SubmitChangeRequest \{\n\s*// ([a-z_, ]+)\n", proto)
    assert listed is not None, "gateway.proto no longer lists the kinds above SubmitChangeRequest"
    docs = (REPO / "docs/architecture.md").read_text()
    documented = re.search(r"- Change kinds: (.*?)\. Each change", docs, re.S)
    assert documented is not None
    assert _named(listed.group(1)) == set(KINDS)
    assert _named(documented.group(1)) == set(KINDS)


def _kind_modules() -> Iterator[str]:
    for module in pkgutil.iter_modules(kinds_package.__path__):
        if module.name != "base":
            yield module.name


def test_every_kind_module_is_registered_under_its_own_name() -> None:
    modules = list(_kind_modules())
    assert sorted(modules) == sorted(KINDS)
    for name in modules:
        kind = importlib.import_module(f"ironclawd.domain.kinds.{name}").KIND
        assert KINDS[name] is kind
        assert kind.name == name


def test_no_two_kinds_show_the_same_field_and_the_view_is_what_older_changes_recorded() -> None:
    seen: dict[str, str] = {}
    for kind in KINDS.values():
        for key in kind.view(replace(DEMO, mounts=SAMPLE_MOUNTS)):
            assert key not in seen, f"{kind.name} and {seen.get(key)} both show {key}"
            seen[key] = kind.name
    # Pinned: the `before` of every stored change was recorded with exactly these fields.
    assert set(agent_view(DEMO) or {}) == {"name", "persona", "provider", "model", "tools",
                                           "egress"}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_kind_round_trips_parse_dump_diff_and_apply(name: str) -> None:
    kind = KINDS[name]
    agent = "helper" if kind.creates_agent else "demo"
    parsed = parse_change(name, agent, json.dumps(SAMPLES[name]))
    dumped = parsed.to_json()
    # The stored form is JSON, canonical, and parses back to the same typed value.
    assert json.loads(canonical(dumped)) == dumped
    assert kind.parse(dumped) == parsed.payload
    assert check_payload(name, agent, canonical(dumped)) == dumped
    assert dataclasses.is_dataclass(parsed.payload)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(parsed.payload, dataclasses.fields(parsed.payload)[0].name, None)

    current = None if kind.creates_agent else DEMO
    after = parsed.apply(current)
    before_view, after_view = agent_view(current), agent_view(after)
    assert after_view is not None
    lines = diff_lines(canonical(before_view), canonical(after_view))
    body = [line for line in lines if not line.startswith(("---", "+++"))]
    changed = {line[1:].split(":")[0] for line in body if line[:1] in "+-"}
    if kind.creates_agent:
        assert before_view is None
        assert after.name == "helper"
        assert changed == set(after_view)
        with pytest.raises(Conflict, match="already exists"):
            parsed.apply(DEMO)
    else:
        assert changed == OWNS[name], lines
        # Nothing outside the kind's own fields moved.
        unowned = {f.name for f in dataclasses.fields(AgentSpec)} - FIELDS[name]
        for field in unowned:
            assert getattr(after, field) == getattr(DEMO, field), field
        with pytest.raises(Conflict, match="does not exist"):
            parsed.apply(None)


def test_every_kind_has_a_sample_and_none_is_refused() -> None:
    assert sorted(SAMPLES) == sorted(KINDS)
    for name, kind in KINDS.items():
        assert not isinstance(kind, RefusedKind), name
        assert not kind.refusal, name


def test_a_refused_kind_is_refused_with_its_reason_and_nothing_parses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kind = RefusedKind("later", why="needs a host feature")
    monkeypatch.setitem(KINDS, kind.name, kind)
    for payload in ("{}", '{"x": 1}'):
        with pytest.raises(InvalidArgument) as err:
            check_payload("later", "demo", payload)
        assert str(err.value) == (
            "kind later: this ironclawd cannot apply later changes yet; nothing was queued "
            "(needs a host feature)"
        )
    with pytest.raises(InvalidArgument, match="cannot apply later changes yet"):
        kind.parse({})


# -- a kind that exists only in this test ------------------------------------------------------


@dataclass(frozen=True)
class Rounds:
    max_tool_rounds: int


class RoundsKind(ChangeKind[Rounds]):
    """Sets the agent's bound on tool rounds; only an operator may raise it above 16, and the
    host check is recorded so the test can see the gateway ran it."""

    name = "tool_rounds"

    def __init__(self) -> None:
        self.host_checked: list[int] = []

    def parse(self, payload: Mapping[str, Any]) -> Rounds:
        only(payload, self.name, {"max_tool_rounds"})
        value = payload.get("max_tool_rounds")
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64:
            raise InvalidArgument("payload.max_tool_rounds: expected an integer from 1 to 64")
        return Rounds(value)

    def dump(self, payload: Rounds) -> dict[str, Any]:
        return {"max_tool_rounds": payload.max_tool_rounds}

    def apply(self, spec: AgentSpec, payload: Rounds) -> AgentSpec:
        return replace(spec, max_tool_rounds=payload.max_tool_rounds)

    def view(self, spec: AgentSpec) -> dict[str, Any]:
        default = AgentSpec(spec.name).max_tool_rounds
        return {} if spec.max_tool_rounds == default else {"max_tool_rounds": spec.max_tool_rounds}

    def authorize(self, payload: Rounds, submitter: str) -> None:
        if payload.max_tool_rounds > 16 and submitter.startswith("session:"):
            raise PolicyDenied("more than 16 tool rounds can only come from an operator")

    def host_check(self, payload: Rounds, host: HostChecks) -> None:
        self.host_checked.append(payload.max_tool_rounds)


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> RoundsKind:
    kind = RoundsKind()
    monkeypatch.setitem(KINDS, kind.name, kind)
    return kind


def test_a_kind_registered_here_goes_through_domain_and_gateway_end_to_end(
    rounds: RoundsKind,
) -> None:
    # Known everywhere the registry is read: the verifier, the config's four_eyes key.
    assert check_payload("tool_rounds", "demo", '{"max_tool_rounds": 3}') == {"max_tool_rounds": 3}
    assert _kinds(["tool_rounds", "persona"]) == ("tool_rounds", "persona")
    with pytest.raises(InvalidArgument, match=r"payload\.max_tool_rounds: expected an integer"):
        check_payload("tool_rounds", "demo", '{"max_tool_rounds": "3"}')
    with pytest.raises(InvalidArgument, match=r"unexpected key\(s\) persona"):
        check_payload("tool_rounds", "demo", '{"max_tool_rounds": 3, "persona": "x"}')
    # The DEMO agent's view is unchanged by the new kind (its field is at the default).
    assert "max_tool_rounds" not in (agent_view(DEMO) or {})

    world = World(GatewayPolicy(four_eyes=frozenset({"tool_rounds"})))
    gateway, registry, restarted = world.gateway, world.registry, world.restarted
    with pytest.raises(PolicyDenied, match="only come from an operator"):
        gateway.submit("tool_rounds", "demo", '{"max_tool_rounds": 40}', "", "session:abc",
                       only_agent="demo")  # fmt: skip
    with pytest.raises(InvalidArgument, match="would change nothing"):
        gateway.submit("tool_rounds", "demo", '{"max_tool_rounds": 8}', "", ROOT)
    change = gateway.submit("tool_rounds", "demo", '{"max_tool_rounds": 3}', "", "session:abc",
                            only_agent="demo")  # fmt: skip
    shown = [line for line in diff_lines(change.before, change.after)[2:] if line[:1] in "+-"]
    assert shown == ["+max_tool_rounds: 3"]
    with pytest.raises(Conflict, match="four-eyes"):
        asyncio.run(gateway.approve(change.id, change.hash, "session:abc"))
    applied = asyncio.run(gateway.approve(change.id, change.hash, ROOT))
    assert applied.state.value == "applied"
    assert registry["demo"].max_tool_rounds == 3
    assert restarted == ["demo"]
    assert rounds.host_checked == [40, 8, 3, 3]  # at each submission and again at apply


def test_an_unregistered_kind_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(InvalidArgument) as err:
        check_payload("tool_rounds", "demo", '{"max_tool_rounds": 3}')
    assert str(err.value) == f"kind: expected one of {', '.join(KINDS)}, got 'tool_rounds'"


# -- no kind or provider is named outside its registry -----------------------------------------


def _sources() -> Iterator[tuple[Path, ast.AST]]:
    for path in sorted((REPO / "ironclawd").rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def test_no_code_outside_the_registry_compares_against_a_kind_name() -> None:
    found = []
    for path, tree in _sources():
        if path.parent.name == "kinds":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    items = (
                        side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
                    )
                    if any(isinstance(c, ast.Constant) and c.value in KINDS for c in items):
                        found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    # ironclawd/api/sandbox.py compares the name of a *socket* ("egress"), not a change kind.
    assert all(f.startswith("ironclawd/api/sandbox.py:") for f in found), found
