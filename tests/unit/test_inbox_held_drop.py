"""An operator's decision on a message held after its receive failed ``MAX_RECEIVE_TRIES``
times (services/inbox.py). When its send failed, a receive row was kept for it, and dropping
the held message deleted only the held row: the kept row was queued to the agent after all, at
the next start (``Receives.resume``) or at its session's first reply to another message
(``Receives.finish``). Dropping now forgets the row too, unless the session's queue has the
message already: then nothing is dropped (replies to it still reach its sender) and the
operator is told so. Admitting it queues the kept row once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ironclawd.errors import ChannelFailed, Conflict, HostError
from ironclawd.ports.channel_records import ChannelMessage, HeldMessage
from ironclawd.ports.channels import Admission
from ironclawd.services import inbox as inbox_module
from tests.unit.test_inbox import ALICE, ROOM, World, run


def failing_sends(w: World) -> list[bool]:
    """Every send to a queue raises while the flag is set (a session that cannot start)."""
    real = w.messages.send
    failing = [True]

    async def send(*args: Any, **kwargs: Any) -> Any:
        if failing[0]:
            raise HostError("starting session: runsc: exit status 128")
        return await real(*args, **kwargs)

    w.messages.send = send  # type: ignore[method-assign]
    return failing


async def held_after_failing(w: World, event_id: str = "$1") -> HeldMessage:
    """The channel offers the event until it is held for an operator."""
    for _ in range(inbox_module.MAX_RECEIVE_TRIES):
        try:
            await w.adapter.inject("secret plan", sender=ALICE, where=ROOM, event_id=event_id)
        except HostError:
            continue
    assert w.adapter.last_receipt.admission is Admission.HELD
    (held,) = w.inbox.held()
    return held


def test_a_dropped_message_is_not_queued_at_the_next_start() -> None:
    async def test(w: World) -> None:
        failing = failing_sends(w)
        held = await held_after_failing(w)
        assert [r.event_id for r in w.records.receiving()] == ["$1"]  # its send failed
        failing[0] = False  # the cause is gone
        assert w.inbox.drop_held(held.id) == held
        assert w.records.receiving() == []
        await w.restart()
        assert w.queued() == [], "a message the operator dropped was queued to the agent"
        assert w.inbox.held() == []

    run(test)


def test_a_dropped_message_is_not_queued_by_its_sessions_next_reply() -> None:
    async def test(w: World) -> None:
        failing = failing_sends(w)
        held = await held_after_failing(w)
        (row,) = w.records.receiving()
        failing[0] = False
        w.inbox.drop_held(held.id)
        await w.messages.send(row.sid, "from ironctl send")
        await w.messages.reply(row.sid, 1, "to the operator")
        await w.inbox.deliverer.idle(row.sid, 1)
        assert w.queued() == ["from ironctl send"]
        assert w.adapter.shown == {}

    run(test)


def test_a_message_queued_while_it_was_held_cannot_be_dropped() -> None:
    """What failed works again before the operator decided (here a restart finished its
    receive): the agent has it, so "dropped" would be untrue; admit clears it."""

    async def test(w: World) -> None:
        failing = failing_sends(w)
        held = await held_after_failing(w)
        failing[0] = False
        await w.restart()
        assert w.queued() == ["secret plan"]
        sid = w.records.channel_sids()[0]
        with pytest.raises(Conflict, match=f"in the queue of session {sid} already .message 1"):
            w.inbox.drop_held(held.id)
        assert w.inbox.held() == [held]
        receipt = await w.inbox.admit(held.id)
        assert (receipt.admission, receipt.sid, receipt.seq) == (Admission.DUPLICATE, sid, 1)
        assert w.inbox.held() == []
        assert w.queued() == ["secret plan"]

    run(test)


def test_a_message_the_queue_took_but_not_recorded_is_not_forgotten() -> None:
    """The queue took it and its record failed each time: forgetting its receive row would
    take the agent's reply to it for an answer to an operator's message, never delivered."""

    async def test(w: World) -> None:
        real = w.records.complete_receive
        failing = [True]

        def complete_receive(message: ChannelMessage) -> None:
            if failing[0]:
                raise HostError("state DB: disk I/O error")
            real(message)

        w.records.complete_receive = complete_receive  # type: ignore[method-assign]
        held = await held_after_failing(w)
        (row,) = w.records.receiving()
        with pytest.raises(Conflict, match=f"in the queue of session {row.sid} already"):
            w.inbox.drop_held(held.id)
        assert w.records.receiving() == [row]
        failing[0] = False
        await w.messages.reply(row.sid, 1, "to alice")
        await w.inbox.deliverer.idle(row.sid, 1)
        assert [r.text for r in w.adapter.shown.values()] == ["to alice"]
        assert w.queued() == ["secret plan"]

    run(test)


def test_a_message_being_queued_right_now_is_not_dropped() -> None:
    async def test(w: World) -> None:
        failing = failing_sends(w)
        held = await held_after_failing(w)
        (row,) = w.records.receiving()
        failing[0] = False
        real = w.messages.send
        sending, go_on = asyncio.Event(), asyncio.Event()

        async def slow_send(sid: str, body: str, client_id: str = "") -> Any:
            if client_id == row.client_id:
                sending.set()
                await go_on.wait()
            return await real(sid, body, client_id)

        w.messages.send = slow_send  # type: ignore[method-assign]
        await w.messages.send(row.sid, "from ironctl send")
        await w.messages.reply(row.sid, 1, "to the operator")  # finishes the kept receive
        await sending.wait()
        with pytest.raises(ChannelFailed, match="being queued right now; try again"):
            w.inbox.drop_held(held.id)
        go_on.set()
        await w.inbox.deliverer.idle(row.sid, 1)
        with pytest.raises(Conflict, match="cannot be dropped"):
            w.inbox.drop_held(held.id)

    run(test)


def test_admitting_a_message_whose_send_failed_queues_its_kept_receive_once() -> None:
    async def test(w: World) -> None:
        failing = failing_sends(w)
        held = await held_after_failing(w)
        (row,) = w.records.receiving()
        failing[0] = False
        receipt = await w.inbox.admit(held.id)
        assert (receipt.admission, receipt.sid, receipt.seq) == (Admission.QUEUED, row.sid, 1)
        assert w.records.receiving() == []
        assert w.messages.inbound[row.sid] == [("secret plan", row.client_id)]
        await w.restart()
        await w.adapter.inject("secret plan", sender=ALICE, where=ROOM, event_id="$1")
        assert w.adapter.last_receipt.admission is Admission.DUPLICATE
        assert w.queued() == ["secret plan"]

    run(test)
