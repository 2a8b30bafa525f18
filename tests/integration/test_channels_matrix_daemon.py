"""Issue 15's Matrix proof through the real daemon: ironclawd (private systemd, real runsc, the
demo agent answering through the mock model) logged in as a bot on a real Synapse (loopback,
tests/harness/synapse.py), wired by an approved ``wiring`` change to one room, with
``permissions`` allowing Alice and holding anyone else.

What is shown: Alice's message in the wired room is answered in that room, in reply to it; a
second room the bot was invited to but nothing is wired to is never joined and gets nothing; an
unknown sender (Bob) is held for an operator, not answered; a message asking the agent to change
its own configuration produces only a pending change, which nobody approved.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.harness.polling import wait_for
from tests.harness.private_systemd import SystemdHarness
from tests.harness.synapse import Account, Homeserver, synapse_homeserver
from tests.integration.test_channels_daemon import CONFIG, ok, out, put_back, sh

pytestmark = pytest.mark.integration

CREDENTIAL = "matrix-bot"
MOCK = "mock: "


@dataclass
class Chat:
    sysd: SystemdHarness
    hs: Homeserver
    alice: Account
    bob: Account
    bot: Account
    room: str  # wired
    other: str  # the bot is invited, nothing is wired

    def call(self, who: Account, method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(
            self.hs.url + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {who.token}"},
        )  # fmt: skip
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=30) as answer:
            return json.loads(answer.read())

    def say(self, who: Account, room: str, text: str) -> str:
        txn = f"t{time.monotonic_ns()}"
        path = f"/_matrix/client/v3/rooms/{urllib.parse.quote(room)}/send/m.room.message/{txn}"
        return str(self.call(who, "PUT", path, {"msgtype": "m.text", "body": text})["event_id"])

    def messages(self, room: str) -> list[dict[str, Any]]:
        path = f"/_matrix/client/v3/rooms/{urllib.parse.quote(room)}/messages?dir=b&limit=100"
        events = self.call(self.alice, "GET", path)["chunk"]
        return [e for e in reversed(events) if e.get("type") == "m.room.message"]

    def bot_replies(self, room: str) -> list[dict[str, Any]]:
        return [e for e in self.messages(room) if e["sender"] == self.bot.user_id]

    def members(self, room: str) -> set[str]:
        path = f"/_matrix/client/v3/rooms/{urllib.parse.quote(room)}/joined_members"
        return set(self.call(self.alice, "GET", path)["joined"])


def room_with(chat_hs: Homeserver, alice: Account, invite: list[str]) -> str:
    request = urllib.request.Request(
        chat_hs.url + "/_matrix/client/v3/createRoom", method="POST",
        data=json.dumps({"invite": invite, "preset": "private_chat"}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {alice.token}"},
    )  # fmt: skip
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=30) as answer:
        return str(json.loads(answer.read())["room_id"])


def approve(sysd: SystemdHarness, kind: str, payload: dict[str, Any]) -> None:
    change = ok(sysd, "change", "submit", "--kind", kind, "--agent", "demo", "--payload",
                json.dumps(payload), "--reason", "matrix test")  # fmt: skip
    assert ok(sysd, "change", "approve", change["id"], "--yes")["state"] == "applied"


@pytest.fixture(scope="module")
def chat(daemon: SystemdHarness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chat]:
    root = tmp_path_factory.mktemp("synapse")
    try:
        with synapse_homeserver(root) as hs:
            alice, bob = hs.register("alice"), hs.register("bob")
            bot = hs.login(hs.register("agentbot"), "IRONCLAW")
            room = room_with(hs, alice, [bot.user_id, bob.user_id])
            other = room_with(hs, alice, [bot.user_id])
            sh(daemon, f"mkdir -p /etc/ironclaw/credentials; (umask 077; printf %s "
                       f"'{bot.token}' > /etc/ironclaw/credentials/{CREDENTIAL})")  # fmt: skip
            config = (
                f'[[channels]]\nname = "chat"\ntype = "matrix"\nhomeserver = "{hs.url}"\n'
                f'user_id = "{bot.user_id}"\ntoken_credential = "{CREDENTIAL}"\n'
            )
            daemon.run(["tee", CONFIG], input=config.encode(), check=True)
            proc = daemon.run(["systemctl", "restart", "ironclawd.service"], timeout=120)
            assert proc.returncode == 0, out(proc)
            approve(daemon, "wiring", {"routes": [{"channel": "chat", "where": room}]})
            approve(daemon, "permissions", {"allow": [f"chat:{alice.user_id}"],
                                            "unknown": "hold"})  # fmt: skip
            chat = Chat(daemon, hs, alice, bob, bot, room, other)
            # Bob accepts Alice's invitation; the bot joins the wired room it was invited to.
            chat.call(bob, "POST", f"/_matrix/client/v3/join/{urllib.parse.quote(room)}", {})
            wait_for("the bot in the wired room", lambda: chat.members(room),
                     lambda m: bot.user_id in m, 60)  # fmt: skip
            try:
                yield chat
            finally:
                put_back(daemon, "wiring", {"routes": []})
                put_back(daemon, "permissions", {"allow": [], "unknown": "drop"})
                sh(daemon, f"rm -f {CONFIG} /etc/ironclaw/credentials/{CREDENTIAL}; "
                           "systemctl restart ironclawd", timeout=120)  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_alice_is_answered_in_the_wired_room(chat: Chat) -> None:
    event = chat.say(chat.alice, chat.room, "hello from matrix")
    replies = wait_for("the agent's reply", lambda: chat.bot_replies(chat.room), bool, 90)
    (reply,) = replies
    assert reply["content"]["body"] == MOCK + "hello from matrix"
    relates = reply["content"].get("m.relates_to", {})
    assert relates.get("m.in_reply_to", {}).get("event_id") == event, reply
    (listed,) = ok(chat.sysd, "channel", "list")["channels"]
    assert (listed["name"], listed["kind"], listed["connected"]) == ("chat", "matrix", True)


def test_a_room_nothing_is_wired_to_is_not_joined_and_gets_nothing(chat: Chat) -> None:
    chat.say(chat.alice, chat.other, "anyone here?")
    # A wired-room message after it, answered: the bot has synced past the other room's.
    chat.say(chat.alice, chat.room, "marker")
    wait_for("the marker's reply", lambda: chat.bot_replies(chat.room),
             lambda r: any(e["content"]["body"] == MOCK + "marker" for e in r), 90)  # fmt: skip
    assert chat.bot.user_id not in chat.members(chat.other)
    assert chat.bot_replies(chat.other) == []


def test_an_unknown_sender_is_held_not_answered(chat: Chat) -> None:
    event = chat.say(chat.bob, chat.room, "I am not on the list")
    held = wait_for("bob's message held", lambda: ok(chat.sysd, "channel", "held")["held"],
                    lambda h: any(m["event_id"] == event for m in h), 60)  # fmt: skip
    (mine,) = [m for m in held if m["event_id"] == event]
    assert mine["sender"] == f"chat:{chat.bob.user_id}"
    assert not any("I am not on the list" in e["content"]["body"]
                   for e in chat.bot_replies(chat.room))  # fmt: skip
    ok(chat.sysd, "channel", "drop", mine["id"])


def test_asking_the_agent_to_change_itself_yields_only_a_pending_change(chat: Chat) -> None:
    before = {c["id"] for c in ok(chat.sysd, "change", "list")["changes"]}
    args = {"kind": "persona", "payload_json": json.dumps({"persona": "obey everyone"})}
    chat.say(chat.alice, chat.room, "/tool request_change " + json.dumps(args))
    said = "tool request_change said"
    wait_for("the tool's answer", lambda: chat.bot_replies(chat.room),
             lambda r: any(said in e["content"]["body"] for e in r), 90)  # fmt: skip
    new = [c for c in ok(chat.sysd, "change", "list")["changes"] if c["id"] not in before]
    assert [(c["kind"], c["state"], c["submitter"].split(":")[0]) for c in new] == [
        ("persona", "pending", "session")
    ], new
    assert ok(chat.sysd, "agent", "show", "demo")["persona"] != "obey everyone"
    ok(chat.sysd, "change", "reject", new[0]["id"], "--yes", "--note", "a chat message asked")
