"""Two endpoints of one webhook channel are two senders: an event id one of them uses is not
the other's (stop 47's review found endpoint b's event "42" taken for a duplicate of endpoint
a's: a was answered "duplicate" and its message never queued). Over a real loopback listener,
the real ``WebhookChannel`` and the real state DB; a reply names the event as its sender did."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.channels import (
    ChannelConfig,
    Permissions,
    Route,
    WebhookEndpoint,
    endpoint_event_id,
    sender_event_id,
)
from ironclawd.formats.webhook_sig import HEADER, sign
from ironclawd.host.webhook import WebhookChannel
from ironclawd.ports.channels import OutboundReply
from ironclawd.services.inbox import Inbox
from ironclawd.store.channel_state import ChannelState
from ironclawd.store.state import StateStore
from tests.fakes import FakeClock
from tests.fakes.channels import FakeChannelSessions, FakeMessages

KEY = bytes(range(32))
SECRETS = {"sec-a": "a" * 40, "sec-b": "b" * 40}


class Posts:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def post(self, **kwargs: Any) -> int:
        self.bodies.append(json.loads(kwargs["body"]))
        return 200


def test_two_endpoints_using_one_event_id_are_two_events(tmp_path: Path) -> None:
    async def go() -> tuple[list[tuple[int, dict[str, Any]]], list[str], Posts]:
        clock = FakeClock()
        clock.now = time.time()
        config = ChannelConfig(
            "hooks", "webhook", listen="127.0.0.1:0",
            endpoints=(WebhookEndpoint("a", "sec-a"), WebhookEndpoint("b", "sec-b")),
        )  # fmt: skip
        agents = {
            name: AgentSpec(
                name,
                wiring=(Route("hooks", where),),
                permissions=Permissions(allow=(f"hooks:{where}",)),
            )
            for name, where in (("alpha", "a"), ("beta", "b"))
        }
        posts = Posts()
        channel = WebhookChannel(config, SECRETS.__getitem__, clock, posts)
        sessions = FakeChannelSessions()
        messages = FakeMessages(sessions)
        store = StateStore(tmp_path / "state.db", KEY)
        inbox = Inbox(records=ChannelState(store), messages=messages, sessions=sessions,
                      agents=agents, adapters={"hooks": channel}, clock=clock)  # fmt: skip
        await channel.start(inbox)
        answers = []
        try:
            async with aiohttp.ClientSession() as http:
                for endpoint, secret, text in (("b", "sec-b", "from b"), ("a", "sec-a", "from a"),
                                               ("a", "sec-a", "from a")):  # fmt: skip
                    raw = json.dumps({"event_id": "42", "text": text}).encode()
                    headers = {HEADER: sign(SECRETS[secret].encode(), int(clock.now), raw)}
                    url = f"http://{channel.bound}/hooks/{endpoint}"
                    async with http.post(url, data=raw, headers=headers) as response:
                        answers.append((response.status, await response.json()))
                    clock.now += 1
            reply = OutboundReply("s-1", "hooks", "a", "", endpoint_event_id("a", "42"), "hello a",
                                  "https://a.example/reply")  # fmt: skip
            await channel.deliver(reply)
        finally:
            await channel.stop()
            store.close()
        texts = sorted(t for queue in messages.inbound.values() for t, _ in queue)
        return answers, texts, posts

    answers, texts, posts = asyncio.run(go())
    assert [(status, body["status"]) for status, body in answers] == [
        (200, "queued"), (200, "queued"), (200, "duplicate")  # a's retry is a's duplicate
    ]  # fmt: skip
    assert texts == ["from a", "from b"]
    assert posts.bodies[0]["in_reply_to_event"] == "42"


def test_an_event_id_stored_before_endpoints_named_theirs_is_the_senders() -> None:
    assert sender_event_id("a", endpoint_event_id("a", "x/y")) == "x/y"
    assert sender_event_id("a", "42") == "42"
    assert sender_event_id("a", "b/42") == "b/42"
