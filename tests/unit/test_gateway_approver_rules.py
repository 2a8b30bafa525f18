"""Who may decide a change, and what a failed apply leaves (found by a review of the change
kinds): a permissions change is decided under the groups it changes, a reply URL is an egress
change, and an apply that fails before anything took effect is recorded failed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from ironclawd.domain.changes import ChangeState
from ironclawd.errors import DiskFull, InvalidArgument, PolicyDenied
from tests.unit.test_packages_kind import world
from tests.unit.test_wiring_kind import ROOT, World

BOB = "uid:1001(bob)"  # in ironclaw-admin, not in the group the rules name
CAROL = "uid:1002(carol)"  # in 'daemon'


def _approve(w: Any, change: Any, who: str, groups: tuple[str, ...]) -> Any:
    return asyncio.run(w.gateway.approve(change.id, change.hash, who, groups))


def _ruled(w: World, approvers: dict[str, str]) -> None:
    c = w.gateway.submit("permissions", "demo", json.dumps({"approvers": approvers}), "", ROOT)
    _approve(w, c, ROOT, ())  # no group decided permissions before


def test_a_permissions_change_is_decided_under_the_groups_it_changes() -> None:
    """Bob could not approve egress, but could approve the permissions change dropping the
    egress rule, then approve egress himself."""
    w = World()
    _ruled(w, {"egress": "daemon"})
    lift = w.gateway.submit("permissions", "demo", "{}", "", "session:s1")
    with pytest.raises(PolicyDenied, match="requires egress changes to be decided by a member of"):
        _approve(w, lift, BOB, ("users",))
    assert _approve(w, lift, CAROL, ("daemon",)).state is ChangeState.APPLIED


def test_a_rule_naming_a_group_is_lifted_only_by_that_group_root_included() -> None:
    """Root is no exception to a group's rule (the design: the group decides); a rule naming a
    group nobody is in is recovered by root joining the group on the host."""
    w = World()
    _ruled(w, {"egress": "nogroup", "permissions": "nogroup"})
    undo = w.gateway.submit("permissions", "demo", "{}", "", BOB)
    with pytest.raises(PolicyDenied, match="member of host group 'nogroup'"):
        _approve(w, undo, ROOT, ("root",))
    assert _approve(w, undo, ROOT, ("root", "nogroup")).state is ChangeState.APPLIED


def test_a_reply_url_is_decided_as_an_egress_change_too() -> None:
    """A route's reply_url sends the agent's replies to a host of the session's choosing."""
    w = World()
    _ruled(w, {"egress": "daemon"})
    route = {"channel": "hooks", "where": "github",
             "reply_url": "https://collector.attacker.example/in"}  # fmt: skip
    wiring = w.gateway.submit("wiring", "demo", json.dumps({"routes": [route]}), "", "session:s1")
    with pytest.raises(PolicyDenied, match=r"this wiring change also changes its egress"):
        _approve(w, wiring, BOB, ("users",))
    assert _approve(w, wiring, CAROL, ("daemon",)).state is ChangeState.APPLIED


def test_an_apply_that_fails_before_taking_effect_is_recorded_failed(tmp_path: Path) -> None:
    """A full disk while its image was built left a change 'approved' with nothing applied,
    and every later approval for the agent, a revocation too, was refused behind it."""
    w, images = world(tmp_path)
    g = w.gateway.submit("egress", "demo", json.dumps({"rules": [{"host": "api.example.org"}]}),
                         "", ROOT)  # fmt: skip
    _approve(w, g, ROOT, ())
    pkg = w.gateway.submit("packages", "demo", '{"packages": ["jq"]}', "", "session:s1")

    def full(packages: object) -> Any:
        raise DiskFull("/var/lib/ironclaw: 0 bytes free")

    images.image = full  # type: ignore[method-assign]
    with pytest.raises(DiskFull):
        _approve(w, pkg, ROOT, ())
    failed = w.store.changes[pkg.id]
    assert failed.state is ChangeState.FAILED
    assert "0 bytes free" in failed.note
    revoke = w.gateway.submit("egress", "demo", '{"rules": []}', "", ROOT)
    assert _approve(w, revoke, ROOT, ()).state is ChangeState.APPLIED


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ('{"persona": ' + "[" * 200_000 + "]" * 200_000 + "}", "nested too deeply"),
        ('{"persona": "hi \\ud800"}', r"lone surrogate \('\\ud800'\)"),
    ],
)
def test_payloads_json_cannot_hash_or_walk_are_refused_and_audited(
    payload: str, message: str
) -> None:
    w = World()
    with pytest.raises(InvalidArgument, match=message):
        w.gateway.submit("persona", "demo", payload, "", "session:s1")
    assert [r for r in w.audit.records if r[0] == "change.refused"]
