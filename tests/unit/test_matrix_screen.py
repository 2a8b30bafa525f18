"""The Matrix adapter asks the inbox whether a sender's event would be refused (unwired room,
dropped sender) before it spends its rate meters (stop 47's review: strangers in a room used up
the channel's rate, and the messages of the senders an agent admits were then dropped as rate
limited). The real ``MatrixChannel`` reading a timeline, the real ``Inbox`` as its sink."""

from __future__ import annotations

import asyncio
from typing import Any

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.channels import ChannelConfig, Permissions, Route
from ironclawd.host import matrix_events as ev
from ironclawd.host.matrix import MatrixChannel
from ironclawd.services.inbox import Inbox
from tests.fakes import FakeClock
from tests.fakes.channels import FakeChannelSessions, FakeMessages, MemoryChannelRecords

ROOM = "!room:test"


def _message(n: int, sender: str) -> dict[str, Any]:
    return {"type": "m.room.message", "sender": sender, "event_id": f"$e{n}",
            "content": {"msgtype": "m.text", "body": f"hi {n}"}}  # fmt: skip


def test_strangers_spend_no_rate_and_an_admitted_sender_gets_through() -> None:
    async def go() -> tuple[list[str], dict[str, int]]:
        clock = FakeClock()
        config = ChannelConfig(
            "chat", "matrix", homeserver="https://hs.test", user_id="@bot:test",
            token_credential="t", sender_messages_per_minute=1, channel_messages_per_minute=3,
        )  # fmt: skip
        channel = MatrixChannel(config, lambda name: "token", clock)
        allowed = Permissions(allow=("chat:@alice:test",))
        agents = {"helper": AgentSpec("helper", wiring=(Route("chat", ROOM),), permissions=allowed)}
        sessions = FakeChannelSessions()
        messages = FakeMessages(sessions)
        inbox = Inbox(records=MemoryChannelRecords(), messages=messages, sessions=sessions,
                      agents=agents, adapters={"chat": channel}, clock=clock)  # fmt: skip
        strangers = tuple(_message(n, f"@stranger{n}:evil.test") for n in range(6))
        events = (*strangers, _message(9, "@alice:test"))
        await channel._hand_room(inbox, ev.RoomTimeline(ROOM, events, False, ""), "s0")
        elsewhere = ev.RoomTimeline("!unwired:test", (_message(20, "@alice:test"),), False, "")
        await channel._hand_room(inbox, elsewhere, "s0")
        texts = [text for queue in messages.inbound.values() for text, _ in queue]
        return texts, dict(channel._counters)

    texts, counters = asyncio.run(go())
    assert texts == ["hi 9"]  # before: alice's message was dropped as rate limited
    assert counters["dropped"] == 6
    assert counters["not_wired"] == 1
    assert counters.get("rate_limited", 0) == 0
