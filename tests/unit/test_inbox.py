"""The inbox (services/inbox*.py) over fakes: every admission path, the session a route's key
picks, exactly-once both ways when the daemon dies between any two steps (a ``HostError`` from
the fake records or queue is the kill; a new ``Inbox`` over the same fakes is the restart)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.channels import Permissions, Route
from ironclawd.errors import ChannelFailed, HostError, NotFound
from ironclawd.ports.channels import Admission
from ironclawd.services import inbox_sessions
from ironclawd.services.inbox import Inbox, client_id
from ironclawd.services.inbox_delivery import Deliverer
from tests.fakes import FakeClock
from tests.fakes.channels import (
    FakeChannelAdapter,
    FakeChannelSessions,
    FakeMessages,
    MemoryChannelRecords,
)

ROOM = "!room:test"
ALICE = "@alice:test"


def agent(name: str = "helper", *, engage: str = "always", pattern: str = "",
          sessions: str = "per_sender", unknown: str = "drop", channel: str = "chat",
          reply_url: str = "") -> AgentSpec:  # fmt: skip
    return AgentSpec(
        name,
        wiring=(Route(channel, ROOM, engage, pattern, sessions, reply_url),),
        permissions=Permissions(allow=(f"chat:{ALICE}",), unknown=unknown),
    )


class World:
    """One daemon's inbox over records, queues and sessions that outlive it (``restart``)."""

    def __init__(self, *specs: AgentSpec, kind: str = "matrix") -> None:
        self.clock = FakeClock()
        self.records = MemoryChannelRecords()
        self.sessions = FakeChannelSessions()
        self.messages = FakeMessages(self.sessions)
        self.adapter = FakeChannelAdapter("chat", kind)
        self.agents = {s.name: s for s in specs or (agent(),)}
        self.sleeps: list[float] = []
        self.killed = False  # a sleep never ends: the daemon was killed while it waited
        self.inbox = self._inbox()

    async def _sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if self.killed:
            await asyncio.Event().wait()
        self.clock.advance(seconds)

    def _inbox(self) -> Inbox:
        adapters = {"chat": self.adapter}
        deliverer = Deliverer(records=self.records, messages=self.messages, adapters=adapters,
                              clock=self.clock, sleep=self._sleep)  # fmt: skip
        return Inbox(
            records=self.records, messages=self.messages, sessions=self.sessions,
            agents=self.agents, adapters=adapters, clock=self.clock, deliverer=deliverer,
        )  # fmt: skip

    async def restart(self) -> None:
        await self.inbox.stop()
        self.inbox = self._inbox()
        await self.inbox.resume()
        await self.inbox.start()

    def queued(self) -> list[str]:
        return [text for q in self.messages.inbound.values() for text, _cid in q]


def run(test: Callable[[World], Awaitable[None]], *specs: AgentSpec, **kw: Any) -> World:
    world = World(*specs, **kw)

    async def go() -> None:
        await world.inbox.start()
        try:
            await asyncio.wait_for(test(world), 10)
        finally:
            await world.inbox.stop()

    asyncio.run(go())
    return world


# -- admission ---------------------------------------------------------------------------


def test_queued_once_with_the_event_derived_client_id() -> None:
    async def test(w: World) -> None:
        await w.adapter.inject("hello", sender=ALICE, where=ROOM, event_id="$1")
        first = w.adapter.last_receipt
        assert first.admission is Admission.QUEUED
        assert first.seq == 1
        assert w.messages.inbound[first.sid] == [("hello", client_id("chat", "$1"))]
        assert client_id("chat", "$1").startswith("ch-")
        assert len(client_id("chat", "$1")) == 43
        await w.adapter.inject("hello", sender=ALICE, where=ROOM, event_id="$1")
        again = w.adapter.last_receipt
        assert (again.admission, again.seq, again.sid) == (Admission.DUPLICATE, 1, first.sid)
        assert w.queued() == ["hello"]

    run(test)


def test_not_wired_queues_nothing() -> None:
    async def test(w: World) -> None:
        await w.adapter.inject("hi", sender=ALICE, where="!other:test")
        assert w.adapter.last_receipt.admission is Admission.NOT_WIRED
        assert "!other:test" in w.adapter.last_receipt.reason
        assert w.queued() == []
        assert w.sessions.sessions == {}

    run(test)


def test_unknown_sender_dropped() -> None:
    async def test(w: World) -> None:
        await w.adapter.inject("let me in", sender="@eve:test", where=ROOM)
        assert w.adapter.last_receipt.admission is Admission.DROPPED
        assert w.queued() == []
        assert w.inbox.held() == []

    run(test)


def test_unknown_sender_held_then_admitted_once() -> None:
    async def test(w: World) -> None:
        for _ in range(2):  # the channel offering it again holds it once
            await w.adapter.inject("let me in", sender="@eve:test", where=ROOM, event_id="$h")
            assert w.adapter.last_receipt.admission is Admission.HELD
        (held,) = w.inbox.held()
        assert (held.sender, held.text, held.event_id) == ("@eve:test", "let me in", "$h")
        assert w.queued() == []
        told: list[tuple[str, list[str]]] = []
        receipt = await w.inbox.admit(held.id, sending=lambda sid: told.append((sid, w.queued())))
        assert receipt.admission is Admission.QUEUED
        # The admitting operator's hook hears of the session before the message reaches it
        # (four-eyes counts the operator among the session's senders).
        assert told == [(receipt.sid, [])]
        assert w.inbox.held() == []
        assert w.queued() == ["let me in"]
        await w.adapter.inject("let me in", sender="@eve:test", where=ROOM, event_id="$h")
        assert w.adapter.last_receipt.admission is Admission.DUPLICATE
        assert w.queued() == ["let me in"]
        with pytest.raises(NotFound, match=f"held message {held.id}"):
            await w.inbox.admit(held.id)

    run(test, agent(unknown="hold"))


def test_held_then_dropped_by_the_operator() -> None:
    async def test(w: World) -> None:
        await w.adapter.inject("spam", sender="@eve:test", where=ROOM)
        (held,) = w.inbox.held()
        assert w.inbox.drop_held(held.id) == held
        assert w.inbox.held() == []
        assert w.queued() == []

    run(test, agent(unknown="hold"))


def test_engage_on_mention_and_pattern() -> None:
    async def test(w: World) -> None:
        await w.adapter.inject("chatter", sender=ALICE, where=ROOM)
        assert [w.adapter.last_receipt.admission] == [Admission.NOT_ENGAGED]
        await w.adapter.inject("bot, help", sender=ALICE, where=ROOM, mentioned=True)
        assert [w.adapter.last_receipt.admission] == [Admission.QUEUED]
        assert w.queued() == ["bot, help"]

    run(test, agent(engage="mention"))

    async def pattern(w: World) -> None:
        await w.adapter.inject("nothing here", sender=ALICE, where=ROOM)
        assert [w.adapter.last_receipt.admission] == [Admission.NOT_ENGAGED]
        await w.adapter.inject("please DEPLOY now", sender=ALICE, where=ROOM)
        assert [w.adapter.last_receipt.admission] == [Admission.QUEUED]

    run(pattern, agent(engage="pattern", pattern=r"\bdeploy\b"))


@pytest.mark.parametrize(("text", "why"), [("", "empty"), ("ring\x07", "U+0007")])
def test_refused_text_never_reaches_a_queue(text: str, why: str) -> None:
    async def test(w: World) -> None:
        await w.adapter.inject(text, sender=ALICE, where=ROOM)
        assert w.adapter.last_receipt.admission is Admission.REFUSED
        assert why in w.adapter.last_receipt.reason
        assert w.queued() == []

    run(test)


# -- sessions ----------------------------------------------------------------------------


@pytest.mark.parametrize(("sessions", "distinct"), [("per_sender", 2), ("per_room", 1),
                                                    ("shared", 1)])  # fmt: skip
def test_session_keys(sessions: str, distinct: int) -> None:
    spec = agent(sessions=sessions)
    both = Permissions(allow=(f"chat:{ALICE}", "chat:@bob:test"))
    spec = AgentSpec(spec.name, wiring=spec.wiring, permissions=both)

    async def test(w: World) -> None:
        for sender in (ALICE, "@bob:test", ALICE):
            await w.adapter.inject("hi", sender=sender, where=ROOM)
        assert len(w.sessions.sessions) == distinct
        assert {s.agent for s in w.sessions.sessions.values()} == {"helper"}

    run(test, spec)


def test_threads_past_a_rooms_cap_share_the_rooms_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A per-room route makes a session per thread, and a sender names threads at will: each
    was a sandbox (stop 47's review). Past ``MAX_ROOM_SESSIONS`` live ones, a new thread goes
    to the room's own session; a thread that has a session keeps it."""
    monkeypatch.setattr(inbox_sessions, "MAX_ROOM_SESSIONS", 3)

    async def test(w: World) -> None:
        sids = []
        for n in range(6):
            await w.adapter.inject(f"m{n}", sender=ALICE, where=ROOM, thread=f"$t{n}")
            sids.append(w.adapter.last_receipt.sid)
        await w.adapter.inject("again", sender=ALICE, where=ROOM, thread="$t1")
        assert w.adapter.last_receipt.sid == sids[1]
        assert len(set(sids[:3])) == 3
        assert sids[3] == sids[4] == sids[5] not in sids[:3]  # the room's session
        assert len(w.sessions.sessions) == 4

    run(test, agent(sessions="per_room"))


def test_a_gone_session_is_replaced() -> None:
    async def test(w: World) -> None:
        await w.adapter.inject("one", sender=ALICE, where=ROOM)
        first = w.adapter.last_receipt.sid
        del w.sessions.sessions[first]  # removed by an operator
        await w.adapter.inject("two", sender=ALICE, where=ROOM)
        assert w.adapter.last_receipt.admission is Admission.QUEUED
        assert w.adapter.last_receipt.sid != first

    run(test)


def test_wired_lists_the_rooms_of_a_channel() -> None:
    w = World(agent(), agent("other", channel="hooks"))
    assert w.inbox.wired("chat") == frozenset({ROOM})
    assert w.inbox.wired("nowhere") == frozenset()


# -- exactly once, inbound -----------------------------------------------------------------


def test_killed_after_the_queue_took_it_a_retry_queues_once() -> None:
    async def test(w: World) -> None:
        w.messages.crash_after_send = True
        with pytest.raises(HostError):
            await w.adapter.inject("once", sender=ALICE, where=ROOM, event_id="$1")
        assert w.adapter.acked == []  # nothing acknowledged to the channel
        await w.adapter.inject("once", sender=ALICE, where=ROOM, event_id="$1")
        assert w.adapter.last_receipt.admission is Admission.DUPLICATE
        assert w.queued() == ["once"]
        assert w.records.message_by_event("chat", "$1") is not None

    run(test)


def test_killed_before_the_message_was_recorded_restart_finishes_it() -> None:
    async def test(w: World) -> None:
        w.records.crash.add("complete_receive")
        with pytest.raises(HostError):
            await w.adapter.inject("once", sender=ALICE, where=ROOM, event_id="$1")
        await w.restart()  # finishes the receive the dead daemon left
        assert w.records.receiving() == []
        await w.adapter.inject("once", sender=ALICE, where=ROOM, event_id="$1")
        assert w.adapter.last_receipt.admission is Admission.DUPLICATE
        assert w.queued() == ["once"]
        sid = w.adapter.last_receipt.sid
        await w.messages.reply(sid, 1, "answer")
        await w.inbox.deliverer.idle(sid, 1)
        assert [r.text for r in w.adapter.shown.values()] == ["answer"]

    run(test)


# -- delivery ------------------------------------------------------------------------------


def test_a_reply_is_delivered_to_where_the_message_came_from() -> None:
    async def test(w: World) -> None:
        await w.adapter.inject("q", sender=ALICE, where=ROOM, event_id="$q", thread="$root")
        sid = w.adapter.last_receipt.sid
        await w.messages.reply(sid, 1, "a")
        await w.inbox.deliverer.idle(sid, 1)
        (shown,) = w.adapter.shown.values()
        assert (shown.delivery_id, shown.where, shown.thread, shown.in_reply_to_event,
                shown.text) == (f"{sid}-1", ROOM, "$root", "$q", "a")  # fmt: skip
        assert w.records.delivery_counts("chat") == {"delivered": 1}

    run(test)


def test_killed_between_deliver_and_mark_the_same_delivery_id_again() -> None:
    async def test(w: World) -> None:
        await w.adapter.inject("q", sender=ALICE, where=ROOM)
        sid = w.adapter.last_receipt.sid
        w.records.crash.add("save_delivery")
        w.killed = True  # before the back-off after the failed save ends
        await w.messages.reply(sid, 1, "a")
        await w.adapter.delivered.wait()
        w.killed = False
        await w.restart()
        await w.inbox.deliverer.idle(sid, 1)
        ids = [d.delivery_id for d in w.adapter.deliveries]
        assert ids == [f"{sid}-1", f"{sid}-1"]  # delivered again, same id
        assert len(w.adapter.shown) == 1  # the channel shows it once
        await w.messages.reply(sid, 1, "b")  # later replies follow
        await w.inbox.deliverer.idle(sid, 2)
        assert [r.text for r in w.adapter.shown.values()] == ["a", "b"]

    run(test)


def test_retryable_failures_back_off_then_deliver() -> None:
    async def test(w: World) -> None:
        w.adapter.failures = [ChannelFailed("503", retryable=True) for _ in range(3)]
        await w.adapter.inject("q", sender=ALICE, where=ROOM)
        sid = w.adapter.last_receipt.sid
        await w.messages.reply(sid, 1, "a")
        await w.inbox.deliverer.idle(sid, 1)
        assert w.sleeps == [1.0, 2.0, 4.0]
        assert [r.text for r in w.adapter.shown.values()] == ["a"]
        assert w.records.deliveries[(sid, 1)].attempts == 4

    run(test)


def test_a_refused_delivery_fails_and_later_replies_still_go() -> None:
    async def test(w: World) -> None:
        w.adapter.failures = [ChannelFailed("M_FORBIDDEN: not in room", retryable=False)]
        await w.adapter.inject("q", sender=ALICE, where=ROOM)
        sid = w.adapter.last_receipt.sid
        await w.messages.reply(sid, 1, "a")
        await w.messages.reply(sid, 1, "b")
        await w.inbox.deliverer.idle(sid, 2)
        assert [r.text for r in w.adapter.shown.values()] == ["b"]
        report = w.inbox.report("chat")
        assert report.deliveries == {"failed": 1, "delivered": 1}
        assert [d.last_error for d in report.failures] == ["M_FORBIDDEN: not in room"]

    run(test)


def test_replies_to_an_operator_message_are_not_delivered() -> None:
    async def test(w: World) -> None:
        await w.adapter.inject("q", sender=ALICE, where=ROOM)
        sid = w.adapter.last_receipt.sid
        await w.messages.send(sid, "from ironctl send")
        await w.messages.reply(sid, 2, "to the operator")
        await w.messages.reply(sid, 1, "to alice")
        await w.inbox.deliverer.idle(sid, 2)
        assert [r.text for r in w.adapter.shown.values()] == ["to alice"]
        assert w.records.deliveries[(sid, 1)].state == "skipped"

    run(test)


def test_a_webhook_route_without_reply_url_delivers_nowhere() -> None:
    async def test(w: World) -> None:
        await w.adapter.inject("q", sender=ALICE, where=ROOM)
        sid = w.adapter.last_receipt.sid
        await w.messages.reply(sid, 1, "a")
        await w.inbox.deliverer.idle(sid, 1)
        assert w.adapter.deliveries == []

    run(test, kind="webhook")


def test_a_reply_faster_than_the_record_waits_for_it() -> None:
    class Eager(FakeMessages):
        async def send(self, sid: str, body: str, client_id: str = "") -> Any:
            sent = await super().send(sid, body, client_id)
            await self.reply(sid, sent.seq, "instant")  # the agent answers before we record
            for _ in range(20):
                await asyncio.sleep(0)
            return sent

    async def test(w: World) -> None:
        await w.adapter.inject("q", sender=ALICE, where=ROOM)
        sid = w.adapter.last_receipt.sid
        await w.inbox.deliverer.idle(sid, 1)
        assert [r.text for r in w.adapter.shown.values()] == ["instant"]

    world = World()
    world.messages = Eager(world.sessions)
    world.inbox = world._inbox()

    async def go() -> None:
        await world.inbox.start()
        try:
            await asyncio.wait_for(test(world), 10)
        finally:
            await world.inbox.stop()

    asyncio.run(go())


def test_status_and_doctor_checks() -> None:
    async def test(w: World) -> None:
        (report,) = w.inbox.reports()
        assert report.status.connected
        (check,) = w.inbox.checks()
        assert check.name == "channel.chat"
        assert check.status.value == "pass"
        with pytest.raises(NotFound, match="channel 'nope' not found"):
            w.inbox.report("nope")

    w = run(test)
    (check,) = w.inbox.checks()  # stopped: not connected
    assert check.status.value == "fail"
    assert not check.required
