"""A send finds its session running, then queues the message in a worker thread; a stop (an
idle stop most often) that ends the sandbox meanwhile left the message in the queue with
nothing to read it: the send reported it accepted, its agent was gone, and the message waited
unanswered until another message started the session again. The send now starts the session
again, as it would have had it found the session stopped (its agent resumes after the last
message it answered)."""

from __future__ import annotations

import asyncio

from ironclawd.domain.session import State
from tests.unit.test_message_writers import _opened, gated

SID = "sendstop0001"


def test_a_message_queued_while_its_session_stopped_starts_it_again() -> None:
    async def go() -> None:
        async with gated(SID) as (data, sessions, messages, gate):
            sending = asyncio.ensure_future(messages.send(SID, "hello"))
            await _opened(data, SID)  # the session ran: the message is being queued
            assert (await sessions.stop(SID)).state is State.STOPPED
            gate.set()
            sent = await asyncio.wait_for(sending, 5)
            assert sent.seq == 1
            assert sessions.get(SID).state is State.RUNNING

    asyncio.run(go())
