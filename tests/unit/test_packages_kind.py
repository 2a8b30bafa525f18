"""The ``packages`` change kind (domain/kinds/packages.py) through the gateway, over the fake
``PackageImages`` (held to the real adapter's contract: tests/contract/package_contract.py):
names only at submission, the host's resolved set stored and hashed, approval builds the image
before the agent changes, a changed ``.deb`` fails the change and changes nothing, and a
shorter list revokes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ironclawd.bundle.packages import owners_of
from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.changes import Change, ChangeState, agent_view, parse_change
from ironclawd.errors import InvalidArgument, PolicyDenied
from ironclawd.host.mounts import HostMounts
from ironclawd.services.gateway import Gateway, GatewayPolicy
from ironclawd.services.registry import Registry
from tests.fakes.packages import FakePackageImages
from tests.unit.test_changes_domain import ROOT, World

DEMO = AgentSpec("demo")


def world(tmp_path: Path) -> tuple[World, FakePackageImages]:
    w = World()
    images = FakePackageImages(tmp_path / "images")
    w.gateway = Gateway(store=w.store, registry=w.registry, audit=w.audit, policy=GatewayPolicy(),
                        restart_agent_sessions=w._restart, mounts=HostMounts(), clock=w.clock,
                        packages=images)  # fmt: skip
    return w, images


def submit(w: World, names: list[str], submitter: str = ROOT) -> Change:
    return w.gateway.submit("packages", "demo", json.dumps({"packages": names}), "", submitter)


def test_submission_stores_the_resolved_set_and_approval_builds_then_applies(
    tmp_path: Path,
) -> None:
    w, images = world(tmp_path)
    change = w.gateway.submit("packages", "demo", '{"packages": ["jq"]}', "", "session:s1",
                              only_agent="demo")  # fmt: skip
    stored = json.loads(change.payload)
    assert stored["packages"] == ["jq"]
    assert {p["name"] for p in stored["resolved"]} == {"jq", "libjq1", "libonig5"}
    after = json.loads(change.after)["packages"]
    assert [p["name"] for p in after] == ["jq", "libjq1", "libonig5"]  # what the approver sees
    assert "packages" not in json.loads(change.before)  # absent while the agent has none
    assert images.built == []  # nothing downloaded before a human decides
    assert w.approve(change).state is ChangeState.APPLIED
    spec = w.registry["demo"]
    assert [p.name for p in spec.packages] == ["jq", "libjq1", "libonig5"]
    assert len(images.built) == 1
    assert Registry(w.agents, [DEMO], w.clock)["demo"] == spec  # persisted


def test_refusals_name_the_reason_and_queue_nothing(tmp_path: Path) -> None:
    w, _ = world(tmp_path)
    with pytest.raises(PolicyDenied, match=r"python3.*python3-yaml"):
        submit(w, ["python3-yaml"])
    with pytest.raises(PolicyDenied, match="bash"):
        submit(w, ["bash"])
    with pytest.raises(InvalidArgument, match="not in the host"):
        submit(w, ["nosuch"])
    with pytest.raises(InvalidArgument, match=r"payload\.packages"):
        submit(w, ["jq=1.6"])
    forged = {"packages": ["jq"], "resolved": []}
    with pytest.raises(InvalidArgument, match="resolved"):
        w.gateway.submit("packages", "demo", json.dumps(forged), "", ROOT)
    with pytest.raises(InvalidArgument, match="change nothing"):
        submit(w, [])
    assert w.store.list_changes() == []


def test_a_deb_changed_after_approval_fails_the_change_and_changes_nothing(
    tmp_path: Path,
) -> None:
    w, images = world(tmp_path)
    change = submit(w, ["jq"])
    images.archive["libonig5"].content = b"a different libonig5"
    with pytest.raises(PolicyDenied, match="libonig5"):
        w.approve(change)
    assert w.store.get_change(change.id).state is ChangeState.FAILED
    assert w.registry["demo"] == DEMO
    assert images.built == []
    assert w.restarted == []


def test_a_shorter_list_revokes_and_the_stored_form_parses_again(tmp_path: Path) -> None:
    w, _ = world(tmp_path)
    assert w.approve(submit(w, ["jq"])).state is ChangeState.APPLIED
    revoke = submit(w, [])
    assert json.loads(revoke.payload) == {"packages": [], "resolved": []}
    parsed = parse_change("packages", "demo", revoke.payload)
    assert parsed.to_json() == json.loads(revoke.payload)
    assert w.approve(revoke).state is ChangeState.APPLIED
    assert w.registry["demo"].packages == ()
    assert "packages" not in (agent_view(w.registry["demo"]) or {})


def test_dpkg_s_owners_skip_diversions() -> None:
    """Debian 13: libc6 diverts the dynamic loader, and dpkg -S says so before the owner."""
    out = (
        "diversion by libc6 from: /lib64/ld-linux-x86-64.so.2\n"
        "diversion by libc6 to: /lib64/ld-linux-x86-64.so.2.usr-is-merged\n"
        "libc6:amd64: /lib64/ld-linux-x86-64.so.2\n"
        "zlib1g:amd64, libfoo: /usr/lib/x86_64-linux-gnu/libz.so.1\n"
    )
    assert owners_of(out) == {"libc6", "zlib1g", "libfoo"}
