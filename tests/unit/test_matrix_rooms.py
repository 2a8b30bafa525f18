"""One Matrix room whose messages cannot be taken (its agent's sessions cannot start) does not
stop the bot's other rooms: a sync hands every room over together, and a receive that raised
stopped the whole batch, synced again with a back-off, for as long as the cause lasted. The
real ``MatrixChannel`` over a scripted sync, the real ``Inbox`` as its sink."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.channels import ChannelConfig, Permissions, Route
from ironclawd.domain.session import Session
from ironclawd.errors import DiskFull, IronclawError, SandboxError
from ironclawd.host import matrix_events as ev
from ironclawd.host.matrix import MatrixChannel
from ironclawd.ports.channels import Admission
from ironclawd.services.inbox import MAX_RECEIVE_TRIES, Inbox
from tests.fakes import FakeClock
from tests.fakes.channels import FakeChannelSessions, FakeMessages, MemoryChannelRecords

BROKEN, HEALTHY = "!broken:test", "!healthy:test"


def _message(n: int, sender: str = "@alice:test") -> dict[str, Any]:
    return {"type": "m.room.message", "sender": sender, "event_id": f"$e{n}",
            "content": {"msgtype": "m.text", "body": f"hi {n}"}}  # fmt: skip


class _Sessions(FakeChannelSessions):
    """Sessions of agent ``broken`` cannot start; ``failure`` says how."""

    def __init__(self) -> None:
        super().__init__()
        self.failure: IronclawError | None = SandboxError("starting session x: runsc: exit 128")

    async def create(self, agent: str, sid: str | None = None) -> Session:
        if agent == "broken" and self.failure is not None:
            raise self.failure
        return await super().create(agent, sid)


@dataclass
class Bot:
    """A bot in two rooms, each wired to its own agent; the homeserver answers every sync from
    the same position with both rooms' messages, and one more in the healthy room each time."""

    clock: FakeClock = field(default_factory=FakeClock)
    sessions: _Sessions = field(default_factory=_Sessions)
    records: MemoryChannelRecords = field(default_factory=MemoryChannelRecords)
    syncs: int = 0

    def __post_init__(self) -> None:
        config = ChannelConfig("chat", "matrix", homeserver="https://hs.test",
                               user_id="@bot:test", token_credential="t")  # fmt: skip
        self.channel = MatrixChannel(config, lambda name: "token", self.clock)
        allow = Permissions(allow=("chat:@alice:test",))
        agents = {
            "broken": AgentSpec("broken", wiring=(Route("chat", BROKEN),), permissions=allow),
            "healthy": AgentSpec("healthy", wiring=(Route("chat", HEALTHY),), permissions=allow),
        }
        self.messages = FakeMessages(self.sessions)
        self.inbox = Inbox(records=self.records, messages=self.messages, sessions=self.sessions,
                           agents=agents, adapters={"chat": self.channel},
                           clock=self.clock)  # fmt: skip
        self.channel._sync = self._sync  # type: ignore[method-assign]

    async def _sync(self, since: Any, timeout_ms: int, filter_: Any) -> ev.SyncBatch:
        self.syncs += 1
        return ev.SyncBatch(
            "s1",
            (ev.RoomTimeline(BROKEN, (_message(1),), False, ""),
             ev.RoomTimeline(HEALTHY, (_message(100 + self.syncs),), False, "")),
            frozenset(), frozenset(),
        )  # fmt: skip

    async def step(self) -> IronclawError | None:
        """One sync handed over; what it raised (the loop would back off and sync again)."""
        try:
            await self.channel._step(self.inbox, "s0")
        except IronclawError as exc:
            return exc
        return None

    def queued(self) -> list[str]:
        return [text for queue in self.messages.inbound.values() for text, _ in queue]


def test_the_other_rooms_go_on_and_a_message_that_keeps_failing_is_held() -> None:
    async def go(bot: Bot) -> list[IronclawError | None]:
        return [await bot.step() for _ in range(MAX_RECEIVE_TRIES)]

    bot = Bot()
    raised = asyncio.run(go(bot))
    assert all(isinstance(exc, SandboxError) for exc in raised[:-1])  # synced again each time
    assert raised[-1] is None
    assert bot.queued() == [f"hi {100 + n}" for n in range(1, MAX_RECEIVE_TRIES + 1)]
    assert bot.records.cursor("chat") == "s1"  # the batch was taken: moved on
    (held,) = bot.inbox.held()
    assert (held.where, held.event_id, held.text) == (BROKEN, "$e1", "hi 1")
    counters = bot.inbox.report("chat").status.counters
    assert counters["room_failed"] == MAX_RECEIVE_TRIES - 1
    assert counters["receive_failed_held"] == 1


def test_a_held_message_is_not_tried_again_until_an_operator_admits_it() -> None:
    async def go(bot: Bot) -> tuple[IronclawError | None, Any]:
        for _ in range(MAX_RECEIVE_TRIES):
            await bot.step()
        again = await bot.step()  # the batch offered again (say the cursor was not saved)
        (held,) = bot.inbox.held()
        bot.sessions.failure = SandboxError("still broken")
        with pytest.raises(SandboxError, match="still broken"):
            await bot.inbox.admit(held.id)  # the operator tries it: it fails, and is kept
        assert [h.id for h in bot.inbox.held()] == [held.id]
        bot.sessions.failure = None  # the agent is fixed
        return again, await bot.inbox.admit(held.id)

    bot = Bot()
    again, admitted = asyncio.run(go(bot))
    assert again is None
    assert admitted.admission is Admission.QUEUED
    assert "hi 1" in bot.queued()
    assert bot.inbox.held() == []


def test_a_full_disk_stops_the_whole_batch_and_holds_nothing() -> None:
    async def go(bot: Bot) -> list[IronclawError | None]:
        bot.sessions.failure = DiskFull("creating session: below daemon.min_free_bytes")
        return [await bot.step() for _ in range(MAX_RECEIVE_TRIES + 2)]

    bot = Bot()
    raised = asyncio.run(go(bot))
    assert all(isinstance(exc, DiskFull) for exc in raised)
    assert bot.queued() == []  # the healthy room waits for space too: nothing goes on past it
    assert bot.inbox.held() == []
    assert bot.records.cursor("chat") is None
