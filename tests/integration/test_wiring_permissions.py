"""Issue 15's ``wiring`` and ``permissions`` kinds through the real daemon (private systemd,
real runsc sandboxes): a wiring change is held pending and takes effect only when a human
approves it (``ironctl wiring show`` before and after), routes that do not fit the configured
channels are refused with what was expected; an agent whose permissions name an approver group
has its changes decided only by members of that host group (an ``ironclaw-admin`` member outside
it is refused, naming the group, and it is on record); and a host user the permissions do not
allow gets PERMISSION_DENIED from ``ironctl send`` while one they name is answered.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.test_gateway import (
    audit_mark,
    audit_records,
    create_session,
    ctl,
    events,
    ok,
    out,
    refused,
    remove_sessions,
    reset_demo,
    sh,
)

pytestmark = pytest.mark.integration

CONFIG = "/etc/ironclaw/ironclawd.toml"
CREDENTIAL = "wiring-test-hook"
GROUP = "ictest-approvers"
MEMBER = "ictest-bob"  # in ironclaw-admin and GROUP; alice is in ironclaw-admin only
PERMISSION_DENIED = 4
INVALID = 7


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(port: int) -> str:
    return f"""[gateway]
submissions_per_hour = 1000

[[channels]]
name = "hooks"
type = "webhook"
listen = "127.0.0.1:{port}"
endpoints = [{{name = "ci", secret_credential = "{CREDENTIAL}"}}]
"""


def _submit(sysd: Any, kind: str, payload: dict[str, Any], user: str | None = None) -> Any:
    doc = ok(sysd, "change", "submit", "--kind", kind, "--agent", "demo", "--payload",
             json.dumps(payload), "--reason", "wiring test", user=user)  # fmt: skip
    assert doc["state"] == "pending", doc
    return doc


def _decide(sysd: Any, verb: str, change_id: str, user: str | None = None) -> Any:
    return ok(sysd, "change", verb, change_id, "--yes", user=user)


def _reset(sysd: Any) -> None:
    """Demo back to no permissions and no wiring (as the member: it may decide everything)."""
    for pending in ok(sysd, "change", "pending")["changes"]:
        _decide(sysd, "reject", pending["id"], user=MEMBER)
    agent = json.loads(ok(sysd, "agent", "show", "demo")["view_json"])
    defaults: dict[str, dict[str, Any]] = {"permissions": {}, "wiring": {"routes": []}}
    for kind, default in defaults.items():
        if kind in agent:
            change = _submit(sysd, kind, default)
            assert _decide(sysd, "approve", change["id"], user=MEMBER)["state"] == "applied"
    reset_demo(sysd)


@pytest.fixture(scope="module")
def wired(daemon: Any) -> Iterator[Any]:
    setup = f"""
        set -e
        getent group {GROUP} >/dev/null || groupadd {GROUP}
        id {MEMBER} >/dev/null 2>&1 || useradd -M -s /usr/sbin/nologin \
            -G ironclaw-admin,{GROUP} {MEMBER}
        mkdir -p /etc/ironclaw/credentials
        (umask 077; printf %s '{"k" * 40}' > /etc/ironclaw/credentials/{CREDENTIAL})
        cat > {CONFIG}
        systemctl restart ironclawd
    """
    proc = sh(daemon, setup, input=_config(_free_port()).encode(), timeout=180)
    assert proc.returncode == 0, out(proc)
    yield daemon
    proc = sh(daemon, f"rm -f {CONFIG} /etc/ironclaw/credentials/{CREDENTIAL}; "
                      "systemctl restart ironclawd")  # fmt: skip
    assert proc.returncode == 0, out(proc)


@pytest.fixture
def demo(wired: Any) -> Iterator[Any]:
    """The configured daemon with demo unwired, without permissions and without sessions."""
    remove_sessions(wired)
    _reset(wired)
    yield wired
    remove_sessions(wired)
    _reset(wired)


def _routes(sysd: Any) -> list[dict[str, Any]]:
    shown = ok(sysd, "wiring", "show", "demo")
    assert shown["agent"] == "demo"
    return list(shown["routes"])


def test_a_wiring_change_waits_for_a_human_and_bad_routes_are_refused(demo: Any) -> None:
    sysd = demo
    route = {"channel": "hooks", "where": "ci", "engage": "pattern", "pattern": r"^deploy\b",
             "reply_url": "http://127.0.0.1:9/replies"}  # fmt: skip
    change = _submit(sysd, "wiring", {"routes": [route]})
    assert '+wiring: [{"channel": "hooks", "engage": "pattern"' in "\n".join(change["diff"])
    # Pending: nothing reaches the agent yet.
    assert _routes(sysd) == []
    assert [r for r in ok(sysd, "wiring", "list")["routes"] if r["agent"] == "demo"] == []
    # Routes that do not fit the configured channels are refused, naming what was expected.
    for bad, needle in [
        ({"channel": "irc", "where": "ci"},
         "channel 'irc' is not configured (configured channels: hooks;"),
        ({"channel": "hooks", "where": "deploys"},
         "channel hooks has no webhook endpoint 'deploys' (configured: ci)"),
        ({"channel": "hooks", "where": "ci", "engage": "pattern", "pattern": "(a+)+$"},
         "payload.routes[0].pattern: a repeat inside a repeat is not allowed"),
    ]:  # fmt: skip
        refused(sysd, ("change", "submit", "--kind", "wiring", "--agent", "demo", "--payload",
                       json.dumps({"routes": [bad]})), INVALID, needle)  # fmt: skip
    assert _decide(sysd, "approve", change["id"])["state"] == "applied"
    expected = {"agent": "demo", "sessions": "per_sender", **route}
    assert _routes(sysd) == [expected]
    assert expected in ok(sysd, "wiring", "list")["routes"]
    table = sysd.run(["ironctl", "wiring", "show", "demo"])
    assert table.returncode == 0, out(table)
    assert "^deploy\\b" in out(table)  # the pattern is text, not terminal markup


def test_only_the_named_group_decides_and_only_allowed_host_users_send(demo: Any) -> None:
    sysd = demo
    perms = {"allow": ["hooks:ci", "user:alice"], "unknown": "hold",
             "approvers": {"wiring": GROUP, "permissions": GROUP}}  # fmt: skip
    assert _decide(sysd, "approve", _submit(sysd, "permissions", perms)["id"])["state"] == (
        "applied"
    )
    shown = ok(sysd, "permissions", "show", "demo")
    assert shown == {"agent": "demo", "allow": ["hooks:ci", "user:alice"], "unknown": "hold",
                     "approvers": {"permissions": GROUP, "wiring": GROUP}}  # fmt: skip

    # alice is an ironclaw-admin member but not in the group: she may submit, not decide.
    mark = audit_mark(sysd)
    change = _submit(sysd, "wiring", {"routes": [{"channel": "hooks", "where": "ci"}]},
                     user="alice")  # fmt: skip
    for verb in ("approve", "reject"):
        refused(sysd, ("change", verb, change["id"], "--yes"), PERMISSION_DENIED,
                f"cannot {verb} {change['id']}", f"host group '{GROUP}'", "alice",
                user="alice")  # fmt: skip
    # Root is no exception: the group decides.
    refused(sysd, ("change", "approve", change["id"], "--yes"), PERMISSION_DENIED,
            f"host group '{GROUP}'")  # fmt: skip
    assert ok(sysd, "change", "show", change["id"])["state"] == "pending"
    assert _routes(sysd) == []
    refusals = events(audit_records(sysd, mark), "change.approval_refused", change=change["id"])
    assert len(refusals) == 3, refusals
    assert all(GROUP in r["reason"] for r in refusals), refusals
    # A member of the group decides; kinds the permissions name no group for are as before.
    assert _decide(sysd, "approve", change["id"], user=MEMBER)["state"] == "applied"
    assert [r["where"] for r in _routes(sysd)] == ["ci"]
    persona = _submit(sysd, "persona", {"persona": "Still decided by any admin."})
    assert _decide(sysd, "approve", persona["id"], user="alice")["state"] == "applied"

    # ironctl send: the permissions name host user alice, so only she may talk to demo.
    sid = create_session(sysd, "perm")
    for user in (MEMBER, None):  # None: root
        code, doc = ctl(sysd, "send", sid, "hello", user=user)
        assert code == PERMISSION_DENIED, (user, doc)
        assert "may not talk to agent 'demo'" in doc["error"]["message"], doc
    reply = ok(sysd, "send", sid, "hello from alice", user="alice")
    assert reply["reply"]["text"], reply
