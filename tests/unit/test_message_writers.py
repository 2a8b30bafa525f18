"""``MessageService`` opens a session's inbound writer at its first send: once per session, and
without holding up the sends of other sessions while it opens (an open is a file, a key and a
schema: several ms on disk, and after a restart every session's first send makes one)."""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any

from tests.contract.test_inbox_ports import AGENT, real_services
from tests.fakes import FakeSessionData

WAIT = 5.0


class GatedOpens(FakeSessionData):
    """Counts the opens of each session's writer; an open of a session in ``gates`` waits for
    its gate, as a slow disk would make it wait."""

    def __init__(self) -> None:
        super().__init__()
        self.opens: collections.Counter[str] = collections.Counter()
        self.gates: dict[str, threading.Event] = {}
        self.entered: collections.defaultdict[str, threading.Event] = collections.defaultdict(
            threading.Event
        )

    def inbound(self, sid: str, gid: int) -> Any:
        self.opens[sid] += 1
        self.entered[sid].set()
        gate = self.gates.get(sid)
        if gate is not None:
            assert gate.wait(WAIT), f"{sid}: the test never opened the gate"
        return super().inbound(sid, gid)


async def _opened(data: GatedOpens, sid: str) -> None:
    assert await asyncio.to_thread(data.entered[sid].wait, WAIT), f"{sid}: no open began"


def test_a_slow_open_for_one_session_holds_up_no_other_sessions_send() -> None:
    data = GatedOpens()
    sessions, messages, *_ = real_services(data)
    gate = data.gates.setdefault("slowsession01", threading.Event())

    async def go() -> None:
        try:
            slow = (await sessions.create(AGENT, "slowsession01")).sid
            other = (await sessions.create(AGENT, "othersession1")).sid
            waiting = asyncio.ensure_future(messages.send(slow, "to the slow one"))
            await _opened(data, slow)
            # Before: every session's writer opened under one lock, so this waited for the gate.
            sent = await asyncio.wait_for(messages.send(other, "to the other"), WAIT / 2)
            assert sent.seq == 1
            assert not waiting.done()
            gate.set()
            assert (await asyncio.wait_for(waiting, WAIT)).seq == 1
        finally:
            gate.set()
            await sessions.close()

    asyncio.run(go())
    assert data.opens == {"slowsession01": 1, "othersession1": 1}


def test_first_sends_to_one_session_at_once_open_one_writer_and_number_in_turn() -> None:
    data = GatedOpens()
    sessions, messages, *_ = real_services(data)
    gate = data.gates.setdefault("busysession01", threading.Event())

    async def go() -> list[int]:
        try:
            sid = (await sessions.create(AGENT, "busysession01")).sid
            sends = [asyncio.ensure_future(messages.send(sid, f"m{i}")) for i in range(4)]
            await _opened(data, sid)
            await asyncio.sleep(0.05)  # the other three reach the open meanwhile
            gate.set()
            async with asyncio.timeout(WAIT):
                return sorted([(await s).seq for s in sends])
        finally:
            gate.set()
            await sessions.close()

    assert asyncio.run(go()) == [1, 2, 3, 4]
    assert data.opens == {"busysession01": 1}


def test_a_removed_session_leaves_no_writer_even_when_removed_while_it_opened() -> None:
    data = GatedOpens()
    sessions, messages, *_ = real_services(data)
    gate = data.gates.setdefault("gonesession01", threading.Event())

    async def go() -> None:
        try:
            sid = (await sessions.create(AGENT, "gonesession01")).sid
            sending = asyncio.ensure_future(messages.send(sid, "last words"))
            await _opened(data, sid)
            # forget waits on the loop for the open under way (as it waited before, for any
            # session's): the gate opens from another thread.
            threading.Timer(0.05, gate.set).start()
            messages.forget(sid)
            await asyncio.wait_for(sending, WAIT)
            assert data.inbound_queues[sid].closed  # the writer that open made was closed
        finally:
            gate.set()
            await sessions.close()

    asyncio.run(go())
