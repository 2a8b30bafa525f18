"""Replies going back out (services/inbox_delivery.py) when the daemon's own bookkeeping fails
or a receive was left half done: a session's replies are delivered once the cause is gone,
without waiting for another channel message or a restart, and none is held behind a receive
that nothing is working on (tests/unit/test_inbox.py has the world these run in)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ironclawd.errors import DiskFull, HostError
from ironclawd.services import inbox_delivery
from tests.fakes.channels import FakeMessages, FakeSent
from tests.unit.test_inbox import ALICE, ROOM, World, run


def fail_once(obj: object, name: str, exc: Exception) -> None:
    """The next call of ``obj.name`` raises ``exc``; the ones after it work."""
    real = getattr(obj, name)
    left = [exc]

    def failing(*args: Any, **kwargs: Any) -> Any:
        if left:
            raise left.pop()
        return real(*args, **kwargs)

    setattr(obj, name, failing)


def shown(w: World) -> list[str]:
    return [r.text for r in w.adapter.shown.values()]


@pytest.mark.parametrize("step", ["add_delivery", "save_delivery"])
def test_a_full_state_db_while_delivering_backs_off_and_delivers(
    step: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def test(w: World) -> None:
        await w.adapter.inject("q", sender=ALICE, where=ROOM, event_id="$1")
        sid = w.adapter.last_receipt.sid
        fail_once(w.records, step, DiskFull("adding a delivery: database or disk is full"))
        await w.messages.reply(sid, 1, "a")  # no other message comes for the session
        await w.inbox.deliverer.idle(sid, 1)
        assert shown(w) == ["a"]
        assert w.records.deliveries[(sid, 1)].state == "delivered"
        assert w.sleeps == [1.0]  # the back-off, then the watch again from reply 1
        await w.messages.reply(sid, 1, "b")
        await w.inbox.deliverer.idle(sid, 2)
        assert shown(w) == ["a", "b"]

    run(test)
    assert "database or disk is full; again in 1s" in caplog.text


def test_a_receive_whose_send_failed_holds_up_no_later_reply() -> None:
    """Its row stayed until a restart, and a reply to an operator's message waited on it (and
    every later reply behind that one) for ever."""

    async def test(w: World) -> None:
        fail_once(w.messages, "send", DiskFull("sending to session: below min_free_bytes"))
        with pytest.raises(DiskFull):
            await w.adapter.inject("lost?", sender=ALICE, where=ROOM, event_id="$1")
        (stale,) = w.records.receiving()
        sid = stale.sid
        await w.messages.send(sid, "from ironctl send")  # seq 1
        await w.adapter.inject("q2", sender=ALICE, where=ROOM, event_id="$2")
        assert w.adapter.last_receipt.seq == 2
        await w.messages.reply(sid, 1, "to the operator")
        await w.messages.reply(sid, 2, "to q2")
        await w.inbox.deliverer.idle(sid, 2)
        assert shown(w) == ["to q2"]
        assert w.records.deliveries[(sid, 1)].state == "skipped"
        # The failed receive was finished as a restart would: queued once, recorded.
        assert w.records.receiving() == []
        assert w.records.message_by_event("chat", "$1") is not None
        assert w.queued() == ["from ironctl send", "q2", "lost?"]

    run(test)


def test_a_reply_to_a_message_whose_record_failed_is_delivered() -> None:
    """The queue took the message, then recording it failed: the reply answers a channel
    message, not an operator's, and goes to the channel without waiting for a restart."""

    async def test(w: World) -> None:
        w.records.crash.add("complete_receive")
        with pytest.raises(HostError):
            await w.adapter.inject("q", sender=ALICE, where=ROOM, event_id="$1")
        (stale,) = w.records.receiving()
        await w.messages.reply(stale.sid, 1, "a")
        await w.inbox.deliverer.idle(stale.sid, 1)
        assert shown(w) == ["a"]
        assert w.queued() == ["q"]

    run(test)


def test_a_receive_being_worked_on_is_waited_for_a_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(inbox_delivery, "RECEIVE_WAIT", 0.2)
    sending, release = asyncio.Event(), asyncio.Event()

    class Slow(FakeMessages):
        async def send(self, sid: str, body: str, client_id: str = "") -> FakeSent:
            if body == "slow":  # a receive being worked on: its queue slow to take it
                sending.set()
                await release.wait()
            return await super().send(sid, body, client_id)

    world = World()
    world.messages = Slow(world.sessions)
    world.inbox = world._inbox()

    async def test(w: World) -> None:
        await w.adapter.inject("q", sender=ALICE, where=ROOM, event_id="$1")
        sid = w.adapter.last_receipt.sid
        await w.messages.send(sid, "from ironctl send")  # seq 2
        slow = asyncio.create_task(w.adapter.inject("slow", sender=ALICE, where=ROOM))
        await sending.wait()
        await w.messages.reply(sid, 2, "to the operator")
        await w.messages.reply(sid, 1, "to q")
        await w.inbox.deliverer.idle(sid, 2)
        assert shown(w) == ["to q"]
        release.set()
        await slow

    async def go() -> None:
        await world.inbox.start()
        try:
            await asyncio.wait_for(test(world), 10)
        finally:
            await world.inbox.stop()

    asyncio.run(go())
