"""A session's removal and the message path racing it (``MessageService``'s lives: a writer,
reader, tail or reply made for a session whose removal began is not kept). Found by a review
(stop 47), each reproduced first: another session's removal during a tail's first load left a
watcher deaf for good and an ingest wedged; replies ingested during a removal outlived it and
were shown to a later session of the same id; a send's writer opened during a removal was
inherited by that later session, whose messages then went to the removed file."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from ironclawd.errors import NotFound
from ironclawd.ports import RawRow
from ironclawd.services.messaging import MessageService
from tests.contract.test_inbox_ports import AGENT, real_services
from tests.fakes import FakeSessionData
from tests.fakes.records import MemoryReplies

WAIT = 5.0


class GatedTail(MemoryReplies):
    """The first load of ``held``'s tail waits at the gate."""

    def __init__(self, held: str) -> None:
        super().__init__()
        self.held = held
        self.gate, self.entered = threading.Event(), threading.Event()

    def last_reply(self, sid: str) -> tuple[int, bytes]:
        if sid == self.held and not self.gate.is_set():
            self.entered.set()
            assert self.gate.wait(WAIT)
        return super().last_reply(sid)


class GatedReads(FakeSessionData):
    """Reads of the agent's outbound rows wait at ``read_gate`` once ``armed``."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.read_gate, self.reading = threading.Event(), threading.Event()

    def outbound(self, sid: str, uid: int) -> Any:
        inner, data = super().outbound(sid, uid), self

        class Reader:
            def read_after(self, after: int, limit: int, max_body: int) -> list[RawRow]:
                rows = inner.read_after(after, limit, max_body)
                if data.armed:
                    data.reading.set()
                    assert data.read_gate.wait(WAIT)
                return rows

            def read_range(self, first: int, last: int, max_body: int) -> list[RawRow]:
                return inner.read_range(first, last, max_body)

            def close(self) -> None:
                inner.close()

        return Reader()


async def _waited(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, WAIT)


def _following(messages: MessageService, sid: str, seen: list[str]) -> asyncio.Future[None]:
    """A watcher following ``sid``'s replies into ``seen``, until it ends or is cancelled."""

    async def follow() -> None:
        async for reply in messages.watch(sid, 0, True):
            seen.append(reply.body)

    return asyncio.ensure_future(follow())


def test_another_sessions_removal_during_a_first_load_leaves_the_watcher_hearing() -> None:
    async def go() -> list[str]:
        sessions, messages, data, *_ = real_services()
        store = messages.store = GatedTail("watchedsess01")
        await sessions.create(AGENT, "watchedsess01")
        await sessions.create(AGENT, "removedsess01")
        seen: list[str] = []
        watcher = _following(messages, "watchedsess01", seen)
        await _waited(store.entered)
        await sessions.remove("removedsess01", force=True)  # any other session, meanwhile
        store.gate.set()
        await asyncio.sleep(0.05)
        await messages.send("watchedsess01", "one")
        data.outbound_rows["watchedsess01"] = [(1, 1, 1.0, b"reply one")]
        assert await messages.ingest("watchedsess01", 1) == 1
        await asyncio.sleep(0.1)  # the watcher was notified: it takes the reply at once
        watcher.cancel()
        await sessions.close()
        return seen

    assert asyncio.run(go()) == ["reply one"]  # before: [] for good


def test_another_sessions_removal_during_a_first_load_does_not_wedge_ingestion() -> None:
    async def go() -> list[int]:
        data = GatedReads()
        sessions, messages, *_ = real_services(data)
        store = messages.store = GatedTail("wedgedsess001")
        await sessions.create(AGENT, "wedgedsess001")
        await sessions.create(AGENT, "removedsess02")
        data.outbound_rows["wedgedsess001"] = [(1, 1, 1.0, b"reply one")]
        data.armed = True
        first = asyncio.ensure_future(messages.ingest("wedgedsess001", 1))
        await _waited(store.entered)
        await sessions.remove("removedsess02", force=True)
        store.gate.set()
        await _waited(data.reading)
        await messages.send("wedgedsess001", "hello")  # keeps a tail while the read runs
        data.armed = False
        data.read_gate.set()
        assert await first == 1
        data.outbound_rows["wedgedsess001"].append((2, 1, 2.0, b"reply two"))
        assert await messages.ingest("wedgedsess001", 2) == 1  # before: AlreadyExists, forever
        rows = sorted(store.rows["wedgedsess001"])
        await sessions.close()
        return rows

    assert asyncio.run(go()) == [1, 2]


def test_replies_read_while_the_session_is_removed_do_not_outlive_it() -> None:
    async def go() -> tuple[int, list[str], dict[str, Any]]:
        data = GatedReads()
        sessions, messages, *_ = real_services(data)
        await sessions.create(AGENT, "ingestrace001")
        data.outbound_rows["ingestrace001"] = [(1, 0, 1.0, b"reply of the old session")]
        data.armed = True
        ingesting = asyncio.ensure_future(messages.ingest("ingestrace001", 1))
        await _waited(data.reading)  # a slow read (a large file) outlasts the removal
        removing = asyncio.ensure_future(sessions.remove("ingestrace001", force=True))
        await asyncio.sleep(0.05)
        data.read_gate.set()
        await asyncio.wait_for(removing, WAIT)
        taken = await asyncio.wait_for(ingesting, WAIT)
        assert isinstance(messages.store, MemoryReplies)
        left = dict(messages.store.rows)
        data.armed = False
        await sessions.create(AGENT, "ingestrace001")  # a new session, the same id
        seen = [r.body async for r in messages.watch("ingestrace001", 0, False)]
        await sessions.close()
        return taken, seen, left

    taken, seen, left = asyncio.run(go())
    assert taken == 0
    assert "ingestrace001" not in left or not left["ingestrace001"]
    assert seen == []  # before: the removed session's reply


def test_a_send_racing_a_removal_leaves_no_writer_for_a_later_session_of_that_id() -> None:
    class Gated(FakeSessionData):
        def __init__(self) -> None:
            super().__init__()
            self.armed = False
            self.removing = threading.Event()  # the removal reached destroy (after forget)

        def check_space(self, doing: str) -> None:
            if self.armed and threading.current_thread() is not threading.main_thread():
                assert self.removing.wait(WAIT)  # the send's thread goes on after forget
            super().check_space(doing)

        def destroy(self, sid: str) -> None:
            if self.armed:
                self.removing.set()
            super().destroy(sid)

    async def go() -> tuple[int, list[Any]]:
        data = Gated()
        sessions, messages, *_ = real_services(data)
        await sessions.create(AGENT, "racesession01")
        data.armed = True
        sending = asyncio.ensure_future(messages.send("racesession01", "to the old session"))
        await asyncio.sleep(0.05)  # the send is in its thread, before its writer
        await sessions.remove("racesession01", force=True)
        with pytest.raises(NotFound, match="racesession01 was removed"):
            await asyncio.wait_for(sending, WAIT)
        data.armed = False
        await sessions.create(AGENT, "racesession01")
        sent = await messages.send("racesession01", "to the new session")
        rows = data.inbound_queues["racesession01"].rows
        await sessions.close()
        return sent.seq, rows

    seq, rows = asyncio.run(go())
    assert seq == 1  # before: 2, appended to the removed session's file
    assert [row[0] for row in rows] == ["to the new session"]


def test_a_watcher_of_a_removed_session_ends() -> None:
    async def go() -> list[str]:
        sessions, messages, *_ = real_services()
        await sessions.create(AGENT, "watchgone0001")
        seen: list[str] = []
        watcher = _following(messages, "watchgone0001", seen)
        await asyncio.sleep(0.05)
        await sessions.remove("watchgone0001", force=True)
        await asyncio.wait_for(watcher, WAIT)  # before: it waited for ever
        await sessions.close()
        return seen

    assert asyncio.run(go()) == []


def test_nothing_new_is_made_for_a_session_while_it_is_removed() -> None:
    async def go() -> None:
        sessions, messages, *_ = real_services()
        await sessions.create(AGENT, "halfgone00001")
        messages.forget("halfgone00001")  # the removal began; its data is not destroyed yet
        assert await messages.ingest("halfgone00001") == 0
        with pytest.raises(NotFound, match="being removed"):
            await messages.send("halfgone00001", "too late")
        messages.gone("halfgone00001")  # the removal is over: the id may be used again
        assert (await messages.send("halfgone00001", "a new life")).seq == 1
        await sessions.close()

    asyncio.run(go())


def test_the_lives_kept_are_the_sessions_in_use() -> None:
    async def go() -> MessageService:
        sessions, messages, *_ = real_services()
        for sid in ("keptsession01", "droppedsess01"):
            await sessions.create(AGENT, sid)
            await messages.send(sid, "hello")
        await sessions.remove("droppedsess01", force=True)
        await sessions.close()
        return messages

    messages = asyncio.run(go())
    assert set(messages._lives) == {"keptsession01"}
    assert not messages._removing
