"""A send finds its session running, then queues the message in a worker thread; a stop (an
idle stop most often) that ends the sandbox meanwhile left the message in the queue with
nothing to read it: the send reported it accepted, its agent was gone, and the message waited
unanswered until another message started the session again. The send now starts the session
again, as it would have had it found the session stopped (its agent resumes after the last
message it answered)."""

from __future__ import annotations

import asyncio
import threading

from ironclawd.domain.session import State
from tests.contract.test_inbox_ports import AGENT, real_services
from tests.fakes import FakeSessionData
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


class GatedSend(FakeSessionData):
    """A send's free-space check (in its worker thread, before the append) waits at ``gate``
    once it is set: the message is being queued meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def check_space(self, doing: str) -> None:
        if self.gate is not None and doing.startswith("sending"):
            self.entered.set()
            assert self.gate.wait(5), "the test never opened the gate"
        super().check_space(doing)


def test_a_message_queued_while_its_sandbox_died_starts_the_session_again() -> None:
    # The sandbox dies while the message is queued: its exit hook (resume_unanswered) finds no
    # unanswered message yet, and the send then found the session failed, not stopped: the
    # message waited with nothing to read it until the next send.
    async def go() -> None:
        data = GatedSend()
        sessions, messages, _, control, _ = real_services(data)
        try:
            session = await sessions.create(AGENT, SID)
            data.gate = threading.Event()
            sending = asyncio.ensure_future(messages.send(SID, "hello"))
            assert await asyncio.to_thread(data.entered.wait, 5)
            sessions.lifecycle.units.exit(session.unit, "signal")  # type: ignore[attr-defined]
            control.drop(SID)
            for _ in range(200):
                if sessions.get(SID).state is State.FAILED:
                    break
                await asyncio.sleep(0.01)
            assert sessions.get(SID).state is State.FAILED
            await asyncio.sleep(0.1)  # its exit hook looked for unanswered messages: none yet
            assert sessions.get(SID).state is State.FAILED
            data.gate.set()
            assert (await asyncio.wait_for(sending, 5)).seq == 1
            assert sessions.get(SID).state is State.RUNNING
        finally:
            if data.gate is not None:
                data.gate.set()
            await sessions.close()

    asyncio.run(go())
