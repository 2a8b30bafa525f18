"""Issue 15's inbox through the real daemon: a signed webhook POSTed to ironclawd (under a
private systemd, real runsc sandboxes, the demo agent answering through the mock model) is
queued exactly once, and the agent's reply is POSTed, signed, to a receiver in a network
namespace this test makes (through the egress broker's rules: ``internal_cidrs`` opens its
range), with a stable ``X-Ironclaw-Delivery-Id``.

The channel, the wiring (approved ``wiring`` change) and the permissions (approved
``permissions`` change) are what an operator would set up. What is shown: the round trip; an
unknown sender held, then admitted or dropped by an operator; an endpoint nothing is wired to
refused; ``ironctl channel`` and ``doctor``; and that ``kill -9`` of the daemon between the
steps of a message's way in and its reply's way out loses and duplicates nothing: every event
is in the session's queue once and answered by exactly one delivery id.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from ironclawd.formats.webhook_sig import DELIVERY_HEADER, HEADER, verify
from tests.harness.polling import wait_for
from tests.harness.private_systemd import SystemdHarness
from tests.integration.channels_world import (
    WebhookSender,
    approve,
    ctl,
    free_port,
    logged_lines,
    out,
    put_back,
    receiver_netns,
)

pytestmark = pytest.mark.integration

ADMIN_SOCKET = "/run/ironclaw/admin.sock"
CONFIG = "/etc/ironclaw/ironclawd.toml"
SECRET = "s3cret-" + "x" * 40  # the endpoints' HMAC key (>= 32 bytes)
# Each endpoint's key credential (a name may key one endpoint only); the same bytes in all,
# so that one sender signs for any of them (channels_world.WebhookSender).
CREDENTIALS = {"ci": "hook-test", "stranger": "hook-test-stranger", "idle": "hook-test-idle"}
MOCK = "mock: "  # the mock model answers "mock: <text>"
READY_BOUND = 60


def sh(sysd: SystemdHarness, script: str, **kwargs: Any) -> Any:
    return sysd.run(["bash", "-c", script], **kwargs)


@dataclass
class World:
    sysd: SystemdHarness
    port: int  # the daemon's webhook listener on 127.0.0.1
    receiver: str  # http://<address>:8080 in the test's netns
    log: Path  # the receiver's JSON lines
    stub: admin_pb2_grpc.AdminServiceStub
    sender: WebhookSender

    def post(self, endpoint: str, event_id: str, text: str, *, deadline: float = 90) -> Any:
        """POST like a webhook sender (channels_world.WebhookSender): retried while the daemon
        is down or answers 503, the same event id, each attempt signed afresh."""
        return self.sender.post(endpoint, event_id, text, deadline)

    def seen(self) -> list[dict[str, Any]]:
        return [e for e in map(json.loads, logged_lines(self.log)) if "path" in e]

    def replies_to(self, event_id: str, timeout: float = 90) -> list[dict[str, Any]]:
        def find() -> list[dict[str, Any]]:
            return [e for e in self.seen() if json.loads(e["body"]).get("in_reply_to_event")
                    == event_id]  # fmt: skip

        return wait_for(f"a reply to {event_id}", find, bool, timeout)

    def kill_and_start(self) -> None:
        script = f"""
            old=$(systemctl show -P MainPID ironclawd.service)
            systemctl kill -s KILL ironclawd.service
            timeout 20 bash -c "while [ \\$(systemctl show -P MainPID ironclawd) = $old ]; do
                                sleep 0.02; done"
            # A start queued while systemd still settles the kill can fail with the kill's
            # result ("signal"): once settled, it starts.
            for try in 1 2 3; do
                timeout {READY_BOUND} systemctl start ironclawd.service && exit 0
                sleep 1; systemctl reset-failed ironclawd.service
            done
            exit 1
        """
        proc = sh(self.sysd, script, timeout=3 * READY_BOUND + 30)
        assert proc.returncode == 0, out(proc)


def config(port: int, cidr: str) -> str:
    # submissions_per_hour: the gateway counts root's changes over an hour, across test files
    # that share this private systemd (after the skills and MCP files it ran out here).
    return f"""
[gateway]
submissions_per_hour = 1000

[egress]
internal_cidrs = ["{cidr}"]

[[channels]]
name = "hooks"
type = "webhook"
listen = "127.0.0.1:{port}"
sender_messages_per_minute = 10000
channel_messages_per_minute = 10000
endpoints = [
  {{name = "ci", secret_credential = "{CREDENTIALS["ci"]}"}},
  {{name = "stranger", secret_credential = "{CREDENTIALS["stranger"]}"}},
  {{name = "idle", secret_credential = "{CREDENTIALS["idle"]}"}},
]
"""


@pytest.fixture(scope="module")
def world(daemon: SystemdHarness) -> Iterator[World]:
    port = free_port()
    setup = f"""
        mkdir -p /etc/ironclaw/credentials
        for name in {" ".join(CREDENTIALS.values())}; do
            (umask 077; printf %s '{SECRET}' > /etc/ironclaw/credentials/$name)
        done
    """
    teardown = f"""
        (cd /etc/ironclaw/credentials && rm -f {" ".join(CREDENTIALS.values())}); rm -f {CONFIG}
        systemctl reset-failed ironclawd; systemctl restart ironclawd
    """
    with receiver_netns(daemon) as rx:
        try:
            proc = sh(daemon, setup)
            assert proc.returncode == 0, out(proc)
            daemon.run(["tee", CONFIG], input=config(port, rx.cidr).encode(), check=True)
            proc = daemon.run(["systemctl", "restart", "ironclawd.service"], timeout=120)
            assert proc.returncode == 0, out(proc)
            approve(daemon, "wiring", {"routes": [
                {"channel": "hooks", "where": "ci", "reply_url": f"{rx.url}/ci"},
                {"channel": "hooks", "where": "stranger", "reply_url": f"{rx.url}/stranger"},
            ]})  # fmt: skip
            approve(daemon, "permissions", {"allow": ["hooks:ci"], "unknown": "hold"})
            with grpc.insecure_channel(f"unix:{daemon.host_path(ADMIN_SOCKET)}") as channel:
                yield World(daemon, port, rx.url, rx.log, admin_pb2_grpc.AdminServiceStub(channel),
                            WebhookSender(port, SECRET))  # fmt: skip
        finally:
            put_back(daemon, "wiring", {"routes": []})
            put_back(daemon, "permissions", {"allow": [], "unknown": "drop"})
            sh(daemon, teardown, timeout=120)


def test_a_signed_message_is_answered_signed_at_the_reply_url(world: World) -> None:
    status, doc = world.post("ci", "round-trip-1", "hello over a webhook")
    assert (status, doc["status"]) == (200, "queued"), doc
    (seen,) = world.replies_to("round-trip-1")
    body = json.loads(seen["body"])
    assert seen["path"] == "/ci"
    assert body["text"] == MOCK + "hello over a webhook"
    assert body["delivery_id"] == seen["headers"][DELIVERY_HEADER]
    assert body["delivery_id"].split("-")[-1].isdigit()
    verify(SECRET.encode(), seen["headers"][HEADER], seen["body"].encode(), time.time(), 300)
    again = world.post("ci", "round-trip-1", "hello over a webhook")
    assert again == (200, {"status": "duplicate", "seq": doc["seq"]}), again


def test_an_endpoint_nothing_is_wired_to_is_refused(world: World) -> None:
    status, doc = world.post("idle", "nowhere-1", "anyone?")
    assert status == 404, doc
    assert not [h for h in ctl(world.sysd, "channel", "held")["held"] if h["event_id"] ==
                "nowhere-1"]  # fmt: skip


def test_an_unknown_sender_is_held_then_admitted_or_dropped(world: World) -> None:
    assert world.post("stranger", "held-1", "please answer me")[0] == 202
    assert world.post("stranger", "held-2", "spam")[0] == 202
    held = {h["event_id"]: h for h in ctl(world.sysd, "channel", "held")["held"]}
    assert held["held-1"]["sender"] == "hooks:stranger"
    assert held["held-1"]["text"] == "please answer me"
    admitted = ctl(world.sysd, "channel", "admit", str(held["held-1"]["id"]))
    assert admitted["admission"] == "queued", admitted
    (seen,) = world.replies_to("held-1")
    assert json.loads(seen["body"])["text"] == MOCK + "please answer me"
    assert seen["path"] == "/stranger"
    ctl(world.sysd, "channel", "drop", str(held["held-2"]["id"]))
    left = {h["event_id"] for h in ctl(world.sysd, "channel", "held")["held"]}
    assert not left & {"held-1", "held-2"}, left
    proc = world.sysd.run(["ironctl", "channel", "admit", str(held["held-2"]["id"]), "--json"])
    assert proc.returncode != 0
    assert "not found" in out(proc)


def test_channel_commands_and_doctor(world: World) -> None:
    world.post("ci", "status-1", "ping")
    world.replies_to("status-1")
    (listed,) = ctl(world.sysd, "channel", "list")["channels"]
    assert (listed["name"], listed["kind"], listed["connected"]) == ("hooks", "webhook", True)
    shown = ctl(world.sysd, "channel", "show", "hooks")
    assert shown["deliveries"]["delivered"] >= 1, shown
    assert f"127.0.0.1:{world.port}" in shown["detail"], shown
    assert ctl(world.sysd, "channel", "test", "hooks")["detail"]
    checks = ctl(world.sysd, "doctor", "--only", "channel.")["checks"]
    assert [(c["name"], c["status"]) for c in checks] == [("channel.hooks", "pass")]
    proc = world.sysd.run(["ironctl", "channel", "show", "nope", "--json"])
    assert proc.returncode != 0
    assert "channel 'nope' not found" in out(proc)


def test_kill_9_between_steps_loses_and_duplicates_nothing(world: World) -> None:
    events = [f"kill-{i}" for i in range(9)]
    for index, event in enumerate(events):
        status, doc = world.post("ci", event, f"message {index}")
        assert (status, doc["status"]) in ((200, "queued"), (200, "duplicate")), doc
        if index % 3 == 0:  # killed right after the POST was acknowledged: reply not out yet
            world.kill_and_start()
        elif index % 3 == 1:  # killed around the reply's delivery
            world.replies_to(event)
            world.kill_and_start()
        # Whatever happened, a sender retrying gets the first send's answer.
        assert world.post("ci", event, f"message {index}") == (200, {"status": "duplicate",
                                                                    "seq": doc["seq"]})  # fmt: skip
    ids: dict[str, set[str]] = {}
    for event in events:
        for seen in world.replies_to(event):
            ids.setdefault(event, set()).add(json.loads(seen["body"])["delivery_id"])
    assert all(len(v) == 1 for v in ids.values()), ids  # one reply each, re-sent with its id
    sid = next(iter(ids["kill-0"])).rsplit("-", 1)[0]
    replies = list(world.stub.WatchReplies(
        admin_pb2.WatchRepliesRequest(sid=sid, after_seq=0, follow=False), timeout=60))  # fmt: skip
    answered = [r.reply.in_reply_to for r in replies]
    assert len(answered) == len(set(answered)), answered  # each queued message answered once
    texts = [r.reply.text for r in replies]
    for index in range(len(events)):
        assert texts.count(f"{MOCK}message {index}") == 1, texts
