"""The ``permissions`` kind: payload refusals naming the field, host checks (groups exist,
channels configured), and the approver-group rule the gateway enforces on approve and reject:
a decider outside the named host group is refused naming the group; a member decides."""

from __future__ import annotations

import asyncio
import json

import pytest

from ironclawd.domain.changes import ChangeState, check_payload
from ironclawd.domain.channels import Permissions
from ironclawd.errors import InvalidArgument, PolicyDenied
from ironclawd.services.registry import Registry
from tests.unit.test_wiring_kind import ROOT, World

ALICE = "uid:1000(alice)"


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ('{"allow": "x"}', "payload.allow: expected a list of at most 256 identities"),
        ('{"allow": ["@alice:x.org"]}', "payload.allow: expected user:<name>, group:<name> or"),
        ('{"unknown": "ask"}', "payload.unknown: expected one of drop, hold, got 'ask'"),
        ('{"approvers": {"deploy": "ops"}}', "payload.approvers: unknown change kind 'deploy' "
         "(expected one of: persona, tools, packages, wiring, permissions,"),
        ('{"approvers": {"wiring": "Ops!"}}', "payload.approvers.wiring: expected a host group"),
        ('{"owners": []}', "payload: unexpected key(s) owners (expected: allow, approvers, "
         "unknown)"),
    ],
)  # fmt: skip
def test_every_bad_permissions_payload_is_refused_naming_the_field(
    payload: str, needle: str
) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_payload("permissions", "demo", payload)
    assert needle in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ({"allow": ["group:no-such-group-x"]}, "host group 'no-such-group-x' does not exist"),
        ({"approvers": {"wiring": "no-such-group-x"}}, "host group 'no-such-group-x' does not"),
        ({"allow": ["irc:nick"]}, "channel 'irc' is not configured (configured channels: chat"),
    ],
)
def test_the_host_refuses_unknown_groups_and_channels(payload: object, needle: str) -> None:
    w = World()
    with pytest.raises(InvalidArgument) as err:
        w.gateway.submit("permissions", "demo", json.dumps(payload), "", ROOT)
    assert needle in str(err.value), str(err.value)
    assert w.store.changes == {}


def _set_permissions(w: World, payload: dict[str, object]) -> None:
    change = w.gateway.submit("permissions", "demo", json.dumps(payload), "", ROOT)
    asyncio.run(w.gateway.approve(change.id, change.hash, ROOT))


def test_an_approver_outside_the_named_group_is_refused_and_a_member_decides() -> None:
    w = World()
    _set_permissions(w, {"allow": ["chat:@alice:x.org", "user:alice"], "unknown": "hold",
                         "approvers": {"persona": "daemon", "permissions": "adm"}})  # fmt: skip
    assert w.registry["demo"].permissions == Permissions(
        allow=("chat:@alice:x.org", "user:alice"), unknown="hold",
        approvers=(("permissions", "adm"), ("persona", "daemon")),
    )  # fmt: skip
    change = w.gateway.submit("persona", "demo", '{"persona": "Terse."}', "", ROOT)
    for groups in ((), ("root", "adm"), ("daemonx",)):
        with pytest.raises(PolicyDenied) as err:
            asyncio.run(w.gateway.approve(change.id, change.hash, ALICE, groups))
        assert str(err.value) == (
            f"cannot approve {change.id}: agent 'demo' requires persona changes to be decided "
            f"by a member of host group 'daemon', and {ALICE} is not one"
        )
        with pytest.raises(PolicyDenied, match=f"cannot reject {change.id}: .* 'daemon'"):
            asyncio.run(w.gateway.reject(change.id, ALICE, "no", groups))
    assert w.store.changes[change.id].state is ChangeState.PENDING
    assert w.registry["demo"].persona != "Terse."
    refused = [r for r in w.audit.records if r[0] == "change.approval_refused"]
    assert len(refused) == 6
    assert all("'daemon'" in str(r[2]["reason"]) for r in refused)
    applied = asyncio.run(w.gateway.approve(change.id, change.hash, ALICE, ("users", "daemon")))
    assert applied.state is ChangeState.APPLIED
    assert w.registry["demo"].persona == "Terse."
    # Kinds the permissions name no group for are decided as before; other agents too.
    tools = w.gateway.submit("tools", "demo", '{"tools": ["read_file"]}', "", ROOT)
    assert asyncio.run(w.gateway.approve(tools.id, tools.hash, ALICE)).state.value == "applied"
    # A permissions change is decided under the rule it would replace.
    loosen = w.gateway.submit("permissions", "demo", "{}", "", ALICE)
    with pytest.raises(PolicyDenied, match="host group 'adm'"):
        asyncio.run(w.gateway.reject(loosen.id, ALICE, "", ("daemon",)))
    rejected = asyncio.run(w.gateway.reject(loosen.id, ROOT, "no", ("adm",)))
    assert rejected.state is ChangeState.REJECTED


def test_permissions_are_shown_only_when_set_and_survive_a_restart() -> None:
    w = World()
    change = w.gateway.submit("permissions", "demo", '{"unknown": "hold"}', "", ROOT)
    assert "permissions" not in json.loads(change.before)
    assert json.loads(change.after)["permissions"] == {
        "allow": [], "unknown": "hold", "approvers": {}}  # fmt: skip
    asyncio.run(w.gateway.approve(change.id, change.hash, ROOT))
    assert Registry(w.agents, [], w.clock)["demo"].permissions == Permissions(unknown="hold")
