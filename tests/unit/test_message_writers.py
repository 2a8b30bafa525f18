"""``MessageService`` opens a session's inbound writer at its first send: once per session, and
without holding up the sends of other sessions while it opens (an open is a file, a key and a
schema: several ms on disk, and after a restart every session's first send makes one)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ironclawd.errors import NotFound
from ironclawd.services.messaging import MessageService
from ironclawd.services.sessions import SessionService
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


World = tuple[GatedOpens, SessionService, MessageService, threading.Event]


@contextlib.asynccontextmanager
async def gated(sid: str) -> AsyncIterator[World]:
    """The real services with a running session ``sid`` whose writer's open waits at the gate
    (yielded). At the end the gate opens, so that no failed test leaves a thread waiting, and
    the services close."""
    data = GatedOpens()
    sessions, messages, *_ = real_services(data)
    gate = data.gates.setdefault(sid, threading.Event())
    try:
        await sessions.create(AGENT, sid)
        yield data, sessions, messages, gate
    finally:
        gate.set()
        await sessions.close()


def test_a_slow_open_for_one_session_holds_up_no_other_sessions_send() -> None:
    async def go() -> GatedOpens:
        async with gated("slowsession01") as (data, sessions, messages, gate):
            other = (await sessions.create(AGENT, "othersession1")).sid
            waiting = asyncio.ensure_future(messages.send("slowsession01", "to the slow one"))
            await _opened(data, "slowsession01")
            # Before: every session's writer opened under one lock, so this waited for the gate.
            sent = await asyncio.wait_for(messages.send(other, "to the other"), WAIT / 2)
            assert sent.seq == 1
            assert not waiting.done()
            gate.set()
            assert (await asyncio.wait_for(waiting, WAIT)).seq == 1
            return data

    assert asyncio.run(go()).opens == {"slowsession01": 1, "othersession1": 1}


def test_first_sends_to_one_session_at_once_open_one_writer_and_number_in_turn() -> None:
    async def go() -> tuple[list[int], GatedOpens]:
        async with gated("busysession01") as (data, _, messages, gate):
            sends = [
                asyncio.ensure_future(messages.send("busysession01", f"m{i}")) for i in range(4)
            ]
            await _opened(data, "busysession01")
            await asyncio.sleep(0.05)  # the other three reach the open meanwhile
            gate.set()
            async with asyncio.timeout(WAIT):
                return sorted([(await s).seq for s in sends]), data

    seqs, data = asyncio.run(go())
    assert seqs == [1, 2, 3, 4]
    assert data.opens == {"busysession01": 1}


def test_a_removed_session_leaves_no_writer_even_when_removed_while_it_opened() -> None:
    async def go() -> None:
        async with gated("gonesession01") as (data, _, messages, gate):
            sending = asyncio.ensure_future(messages.send("gonesession01", "last words"))
            await _opened(data, "gonesession01")
            # forget waits on the loop for the open under way (as it waited before, for any
            # session's): the gate opens from another thread.
            threading.Timer(0.05, gate.set).start()
            messages.forget("gonesession01")
            # The send fails (its message would be destroyed with the session anyway), and the
            # writer that open made was closed, not kept for a later session of that id.
            with pytest.raises(NotFound, match="session gonesession01 was removed"):
                await asyncio.wait_for(sending, WAIT)
            assert data.inbound_queues["gonesession01"].closed

    asyncio.run(go())
