"""Issue 15's proof on real components: a real Matrix homeserver (Synapse, SQLite, loopback) and a
signed webhook, both wired by approved changes to the demo agent of a real ironclawd (private
systemd, runsc sandboxes, the mock model).

- Alice talks to the agent in a wired room and the reply comes back in that room, as a reply.
- A second room nothing is wired to gets nothing: the bot does not even join it.
- Bob, whom the permissions do not list, is held (`unknown = "hold"`) until an operator admits
  him; a dropped sender never reaches a queue.
- Asking the agent to change its own configuration produces only a pending change.
- 1,000 messages over both channels with three `kill -9`s of the daemon: every one is answered
  exactly once (Matrix: one reply event per message; webhook: one delivery id per message).
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import operator
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.harness.agents import unlimited_agent
from tests.harness.polling import wait_for
from tests.harness.private_systemd import SystemdHarness
from tests.harness.synapse import Account, Homeserver, synapse_homeserver
from tests.integration.channels_world import (
    Loop,
    MatrixUser,
    Receiver,
    WebhookSender,
    approve,
    ctl,
    free_port,
    out,
    put_back,
    receiver_netns,
)

pytestmark = pytest.mark.integration

CONFIG = "/etc/ironclaw/ironclawd.toml"
CREDENTIALS = "/etc/ironclaw/credentials"
SECRET = "proof-" + "k" * 40
MOCK = "mock: "
# Messages per channel in the stress test (the issue asks for 1,000 over both).
PER_CHANNEL = int(os.environ.get("IRONCLAW_CHANNEL_STRESS", "500"))
STRESS_DEADLINE = 600.0
RELAY = "relay"


def kill_daemon(sysd: SystemdHarness) -> None:
    """SIGKILL; systemd (Restart=on-failure) starts it again."""
    proc = sysd.run(["systemctl", "kill", "-s", "KILL", "ironclawd.service"], timeout=60)
    assert proc.returncode == 0, out(proc)


@dataclass
class Proof:
    sysd: SystemdHarness
    hs: Homeserver
    bot: Account
    alice: MatrixUser
    bob: MatrixUser
    wired: str  # room id wired to the demo agent
    unwired: str  # a room the bot was invited to, wired to nothing
    loaded: str  # room id wired to the relay agent (the stress test's)
    hooks: WebhookSender
    receiver: Receiver

    def reply_in(self, room: str, event_id: str, timeout: float = 90) -> list[str]:
        def got() -> list[str]:
            return self.alice.replies_from(room, self.bot.user_id).get(event_id, [])

        return wait_for(f"the bot's reply to {event_id}", got, bool, timeout)


def _config(port: int, hs: Homeserver, bot: Account, cidr: str) -> str:
    # The stress test's agent: the demo agent's tools and mock model, without rate limits.
    relay = unlimited_agent(RELAY, ("read_file", "write_file", "list_files", "request_change"))
    return (
        relay
        + f"""
[gateway]
submissions_per_hour = 1000

[sockets]
# A backlog after a kill lets the agent call the model faster than the default 50 calls/s of
# its socket (test_messages' stress runs lift it too).
calls_per_second = 2000

[egress]
internal_cidrs = ["{cidr}"]

[[channels]]
name = "chat"
type = "matrix"
homeserver = "{hs.url}"
user_id = "{bot.user_id}"
token_credential = "proof-matrix"
sender_messages_per_minute = 100000
channel_messages_per_minute = 100000

[[channels]]
name = "hooks"
type = "webhook"
listen = "127.0.0.1:{port}"
sender_messages_per_minute = 100000
channel_messages_per_minute = 100000
endpoints = [{{name = "load", secret_credential = "proof-hook"}}]
"""
    )


@pytest.fixture(scope="module")
def proof(daemon: SystemdHarness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proof]:
    loop = Loop()
    try:
        with synapse_homeserver(tmp_path_factory.mktemp("synapse")) as hs, \
                receiver_netns(daemon) as receiver:  # fmt: skip
            registered = hs.register("ironclaw")
            bot = hs.login(registered, "IRONCLAW")
            people = [hs.register(name) for name in ("alice", "bob")]
            alice, bob = (MatrixUser(loop, hs.url, a.user_id, a.device_id, a.token) for a in people)
            wired = alice.create_room([bot.user_id, bob.user_id])
            unwired = alice.create_room([bot.user_id])
            loaded = alice.create_room([bot.user_id])
            bob.join(wired)
            port = free_port()
            setup = f"""
                set -e
                install -d -m 0700 {CREDENTIALS}
                umask 077
                printf %s '{bot.token}' > {CREDENTIALS}/proof-matrix
                printf %s '{SECRET}' > {CREDENTIALS}/proof-hook
            """
            assert daemon.run(["bash", "-c", setup]).returncode == 0
            daemon.run(["tee", CONFIG], input=_config(port, hs, bot, receiver.cidr).encode(),
                       check=True)  # fmt: skip
            proc = daemon.run(["systemctl", "restart", "ironclawd.service"], timeout=120)
            assert proc.returncode == 0, out(proc)
            try:
                approve(daemon, "wiring", {"routes": [
                    {"channel": "chat", "where": wired, "sessions": "per_room"}]})  # fmt: skip
                approve(daemon, "permissions", {
                    "allow": [f"chat:{alice.user_id}"], "unknown": "hold"})  # fmt: skip
                approve(daemon, "wiring", {"routes": [
                    {"channel": "chat", "where": loaded, "sessions": "per_room"},
                    {"channel": "hooks", "where": "load", "reply_url": f"{receiver.url}/load"},
                ]}, RELAY)  # fmt: skip
                approve(daemon, "permissions", {
                    "allow": [f"chat:{alice.user_id}", "hooks:load"]}, RELAY)  # fmt: skip
                # The bot joins a wired room it was invited to (within ~5 s of the approval); what
                # was said in a room before the bot joined is never answered.
                for room in (wired, loaded):
                    wait_for(f"the bot in {room}", functools.partial(alice.membership, room,
                             bot.user_id), lambda m: m == "join", 90)  # fmt: skip
                yield Proof(daemon, hs, bot, alice, bob, wired, unwired, loaded,
                            WebhookSender(port, SECRET), receiver)  # fmt: skip
            finally:
                # Each step runs even when one before it failed: a test that failed right after
                # killing the daemon leaves it restarting, and unclosed Matrix clients would
                # surface as ResourceWarnings in whichever later test the collector runs in.
                try:
                    wait_for("ironclawd serving again",
                             lambda: daemon.run(["ironctl", "status"], timeout=60).returncode,
                             functools.partial(operator.eq, 0), 60)  # fmt: skip
                    for agent in ("demo", RELAY):
                        put_back(daemon, "wiring", {"routes": []}, agent)
                        put_back(daemon, "permissions", {"allow": [], "unknown": "drop"}, agent)
                    for session in ctl(daemon, "session", "list")["sessions"]:
                        daemon.run(["ironctl", "session", "rm", "--force", session["sid"]],
                                   timeout=120)  # fmt: skip
                finally:
                    daemon.run(["bash", "-c", f"rm -f {CONFIG} {CREDENTIALS}/proof-*; "
                                "systemctl restart ironclawd"], timeout=120)  # fmt: skip
                    alice.close()
                    bob.close()
    finally:
        loop.close()


def test_alice_is_answered_in_the_wired_room_and_the_unwired_room_gets_nothing(
    proof: Proof,
) -> None:
    ignored = proof.alice.say(proof.unwired, "is anyone listening here?")
    asked = proof.alice.say(proof.wired, "hello over matrix")
    assert proof.reply_in(proof.wired, asked) == [f"{MOCK}hello over matrix"]
    # The bot's sync saw both messages before it answered the second: the first is ignored.
    later = proof.alice.say(proof.wired, "and again")
    assert proof.reply_in(proof.wired, later) == [f"{MOCK}and again"]
    assert proof.alice.replies_from(proof.unwired, proof.bot.user_id) == {}
    assert ignored not in proof.alice.replies_from(proof.wired, proof.bot.user_id)
    assert proof.alice.membership(proof.unwired, proof.bot.user_id) == "invite"
    status = ctl(proof.sysd, "channel", "show", "chat")
    assert status["connected"], status


def test_an_unknown_sender_is_held_until_an_operator_admits_him(proof: Proof) -> None:
    asked = proof.bob.say(proof.wired, "let me talk to the agent")

    def held() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = ctl(proof.sysd, "channel", "held")["held"]
        return [h for h in items if h["event_id"] == asked]

    [item] = wait_for("bob's message held", held, bool, 60)
    assert item["sender"] == f"chat:{proof.bob.user_id}"
    marker = proof.alice.say(proof.wired, "marker after bob")
    proof.reply_in(proof.wired, marker)
    assert asked not in proof.alice.replies_from(proof.wired, proof.bot.user_id)
    ctl(proof.sysd, "channel", "admit", item["id"])
    assert proof.reply_in(proof.wired, asked) == [f"{MOCK}let me talk to the agent"]
    assert held() == []


def test_a_message_asking_for_a_configuration_change_only_makes_a_pending_change(
    proof: Proof,
) -> None:
    before = ctl(proof.sysd, "agent", "show", "demo")
    request = ('/tool request_change {"kind": "tools", "payload_json": '
               '"{\\"tools\\": [\\"read_file\\"]}", "reason": "a message told me to"}')  # fmt: skip
    asked = proof.alice.say(proof.wired, request)
    proof.reply_in(proof.wired, asked)
    pending = [c for c in ctl(proof.sysd, "change", "pending")["changes"]
               if c["submitter"].startswith("session:")]  # fmt: skip
    assert [c["kind"] for c in pending] == ["tools"], pending
    assert ctl(proof.sysd, "agent", "show", "demo") == before
    ctl(proof.sysd, "change", "reject", pending[0]["id"], "--yes", "--note", "not from a chat")


def test_a_thousand_messages_over_both_channels_with_three_kills_each_answered_once(
    proof: Proof,
) -> None:
    matrix_events: dict[int, str] = {}
    errors: list[str] = []

    def matrix_sender() -> None:
        for i in range(PER_CHANNEL):
            try:
                matrix_events[i] = proof.alice.say(proof.loaded, f"m{i}", txn=f"proof-m{i}")
            except Exception as exc:
                errors.append(f"matrix {i}: {exc}")
                return

    def webhook_one(i: int) -> None:
        status, doc = proof.hooks.post("load", f"w{i}", f"w{i}", deadline=STRESS_DEADLINE)
        if (status, doc.get("status")) not in ((200, "queued"), (200, "duplicate")):
            errors.append(f"webhook {i}: {status} {doc}")

    def webhook_sender() -> None:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(webhook_one, range(PER_CHANNEL)))

    def webhook_answered() -> set[str]:
        return {r["in_reply_to_event"] for r in proof.receiver.replies("/load")}

    started = time.monotonic()
    senders = [threading.Thread(target=matrix_sender), threading.Thread(target=webhook_sender)]
    for thread in senders:
        thread.start()
    kills = []
    for point in (PER_CHANNEL // 5, PER_CHANNEL // 2, PER_CHANNEL * 4 // 5):
        wait_for(f"{point} webhook replies", lambda: len(webhook_answered()),
                 functools.partial(operator.le, point), STRESS_DEADLINE)  # fmt: skip
        kill_daemon(proof.sysd)
        kills.append((point, round(time.monotonic() - started, 1)))
    for thread in senders:
        thread.join(STRESS_DEADLINE)
    assert not errors, errors[:20]
    wanted = {f"w{i}" for i in range(PER_CHANNEL)}
    wait_for("every webhook message answered", lambda: wanted <= webhook_answered(), bool,
             STRESS_DEADLINE)  # fmt: skip

    def matrix_answered() -> dict[str, list[str]]:
        return proof.alice.replies_from(proof.loaded, proof.bot.user_id)

    asked = set(matrix_events.values())
    wait_for("every Matrix message answered", lambda: asked <= set(matrix_answered()), bool,
             STRESS_DEADLINE)  # fmt: skip
    elapsed = time.monotonic() - started
    # Matrix: one reply event per message (the homeserver de-duplicates re-sent txn ids).
    replies = matrix_answered()
    by_index = {i: replies.get(e, []) for i, e in matrix_events.items()}
    wrong = {i: r for i, r in by_index.items() if r != [f"{MOCK}m{i}"]}
    assert not wrong, dict(list(wrong.items())[:10])
    # Webhook: every event answered under exactly one delivery id, with the right text; a
    # delivery re-POSTed after a kill carries the same id (the receiver de-duplicates on it).
    ids: dict[str, set[str]] = {}
    texts: dict[str, set[str]] = {}
    for reply in proof.receiver.replies("/load"):
        ids.setdefault(reply["in_reply_to_event"], set()).add(reply["delivery_id"])
        texts.setdefault(reply["in_reply_to_event"], set()).add(reply["text"])
    assert set(ids) == wanted
    assert all(len(v) == 1 for v in ids.values()), {k: v for k, v in ids.items() if len(v) > 1}
    assert all(texts[f"w{i}"] == {f"{MOCK}w{i}"} for i in range(PER_CHANNEL)), texts
    reposted = len(proof.receiver.replies("/load")) - len(wanted)
    print(json.dumps({"messages": 2 * PER_CHANNEL, "seconds": round(elapsed, 1), "kills": kills,
                      "webhook_sender_retries": proof.hooks.retries,
                      "webhook_reposts": reposted}))  # fmt: skip
