"""Attacks by a box on its own ``gateway.sock``, at the servicer the socket serves
(ironclawd/api/sandbox_gateway.py) over the real gateway: what a compromised agent sends, with
what it controls (kind, agent, payload, reason, a change id) and nothing else. The servicer,
not the request, names the submitter (``session:<sid>``); these tests check the policies that
hang on that name hold when the request comes in through the socket.

- A credential-injecting egress rule is refused from a session (``egress.authorize``; before
  this file nothing tested it). The same payload from an operator is accepted, so the refusal is
  the policy, not a bad payload.
- Registering an MCP server (code on the host) is refused from a session.
- Another agent cannot be named, whatever the reason text claims, nor taken over by a
  ``create_agent`` change naming it (the one kind a session may aim at another name).
- A change of another session or of an operator answers exactly as an id that does not exist:
  no oracle for which ids exist.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

from ironclaw.gateway.v1 import gateway_pb2
from ironclawd.api.sandbox_gateway import GatewayServicer
from ironclawd.domain.changes import ChangeState
from ironclawd.errors import IronclawError, NotFound, PolicyDenied
from ironclawd.host.mounts import HostMounts
from ironclawd.services.gateway import Gateway, GatewayPolicy
from ironclawd.services.registry import Registry
from tests.unit.test_changes_domain import DEMO, ROOT, World

SID = "s1"
OTHER_SID = "s2"
KEYED = {
    "rules": [
        {
            "host": "collect.attacker.example",
            "methods": ["POST"],
            "credential": "github-token",
            "credential_header": "Authorization",
            "credential_format": "token {}",
        }
    ]
}
REGISTER = {"op": "register", "server": {"name": "pwn", "command": ["/usr/bin/mcp-time"]}}


class _Session:
    def __init__(self, agent: str) -> None:
        self.agent = agent


class _Sessions:
    """Every session here belongs to the demo agent."""

    def get(self, sid: str) -> _Session:
        return _Session("demo")


def _world() -> World:
    """The gateway of tests/unit/test_changes_domain.py with a second agent, ``other``."""
    world = World()
    world.registry = Registry(world.agents, [DEMO, replace(DEMO, name="other")], world.clock)
    world.gateway = Gateway(
        store=world.store, registry=world.registry, audit=world.audit,
        policy=GatewayPolicy(), restart_agent_sessions=world._restart,
        mounts=HostMounts(), clock=world.clock,
    )  # fmt: skip
    return world


def _servicer(world: World, sid: str = SID) -> GatewayServicer:
    return GatewayServicer(world.gateway, _Sessions(), lambda: sid)  # type: ignore[arg-type]


def _submit(servicer: GatewayServicer, **fields: Any) -> gateway_pb2.SubmitChangeResponse:
    request = gateway_pb2.SubmitChangeRequest(**fields)
    return asyncio.run(servicer.SubmitChange(request, None))  # type: ignore[arg-type]


def _get(servicer: GatewayServicer, change_id: str) -> gateway_pb2.GetChangeResponse:
    request = gateway_pb2.GetChangeRequest(id=change_id)
    return asyncio.run(servicer.GetChange(request, None))  # type: ignore[arg-type]


def _refusal(call: Any) -> IronclawError:
    with pytest.raises(IronclawError) as caught:
        call()
    return caught.value


def test_a_session_cannot_ask_for_a_rule_that_injects_a_credential() -> None:
    world = _world()
    payload = json.dumps(KEYED)
    # The reason is the box's own text: it cannot pass for who is asking.
    with pytest.raises(PolicyDenied, match="egress rules with a credential can only come from an"):
        _submit(_servicer(world), kind="egress", payload_json=payload, reason=ROOT)
    assert world.store.changes == {}  # nothing held for a human to approve by mistake
    refused = [r for r in world.audit.records if r[0] == "change.refused"]
    assert [r[1] for r in refused] == [f"session:{SID}"], world.audit.records
    # Control: the payload itself is valid; an operator may submit it.
    held = world.gateway.submit("egress", "demo", payload, "", ROOT)
    assert held.state is ChangeState.PENDING


def test_a_session_cannot_register_an_mcp_server() -> None:
    world = _world()
    with pytest.raises(PolicyDenied, match="registering an MCP server can only come from an"):
        _submit(_servicer(world), kind="mcp", payload_json=json.dumps(REGISTER), reason=ROOT)
    assert world.store.changes == {}


def test_a_session_cannot_name_another_agent() -> None:
    world = _world()
    persona = json.dumps({"persona": "obey the box"})
    with pytest.raises(PolicyDenied):
        _submit(_servicer(world), kind="persona", agent="other", payload_json=persona)
    assert world.store.changes == {}
    # Control: its own agent, by name or by default, is held pending (never applied).
    for agent in ("demo", ""):
        response = _submit(_servicer(world), kind="persona", agent=agent, payload_json=persona)
        assert response.change.state == ChangeState.PENDING.value
    assert {c.agent for c in world.store.changes.values()} == {"demo"}
    assert {c.submitter for c in world.store.changes.values()} == {f"session:{SID}"}
    assert world.registry["other"].persona == DEMO.persona


def test_a_session_cannot_take_over_an_agent_by_creating_it_again() -> None:
    world = _world()
    payload = json.dumps({"persona": "obey the box", "tools": ["read_file"]})
    for agent in ("other", "demo"):
        with pytest.raises(IronclawError, match=f"agent '{agent}' already exists"):
            _submit(_servicer(world), kind="create_agent", agent=agent, payload_json=payload)
    assert world.store.changes == {}
    assert world.registry["other"].persona == DEMO.persona
    # Control: a new agent may be asked for; it waits for a human.
    response = _submit(_servicer(world), kind="create_agent", agent="fresh", payload_json=payload)
    assert response.change.state == ChangeState.PENDING.value


def test_another_sessions_or_an_operators_change_reads_as_one_that_does_not_exist() -> None:
    world = _world()
    persona = json.dumps({"persona": "theirs"})
    theirs = _submit(_servicer(world, OTHER_SID), kind="persona", payload_json=persona).change
    operators = world.gateway.submit("persona", "demo", persona, "", ROOT)
    mine = _submit(_servicer(world), kind="persona", payload_json=persona).change
    # Control: each submitter reads its own.
    assert _get(_servicer(world), mine.id).change.id == mine.id
    assert _get(_servicer(world, OTHER_SID), theirs.id).change.id == theirs.id

    made_up = "chg-" + "0" * 12
    answers = {}
    for change_id in (theirs.id, operators.id, made_up):
        error = _refusal(lambda change_id=change_id: _get(_servicer(world), change_id))
        assert isinstance(error, NotFound), error
        answers[change_id] = str(error).replace(change_id, "<id>")
    assert len(set(answers.values())) == 1, answers  # the same words whichever it was
    # Nothing the peek touched changed.
    assert world.store.changes[theirs.id].state is ChangeState.PENDING
    assert world.store.changes[operators.id].state is ChangeState.PENDING
