"""A removed session's channel rows go with its data (store/state.py ``destroy_session_data``,
on a real SQLCipher file): nothing kept its messages, deliveries, session keys or receives, so
the state DB grew by a message and a delivery row per channel message for the host's life,
every start followed every session that ever had a channel message, and a later session of the
same id took over its deliveries. Only the ids of its events stay, bounded, so that one its
channel offers again is still a duplicate."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from ironclawd.ports.channel_records import ChannelMessage, Delivery, Receiving
from ironclawd.ports.channels import Admission
from ironclawd.services.inbox import Inbox
from ironclawd.store import state
from ironclawd.store.channel_state import ChannelState
from ironclawd.store.state import StateStore
from tests.fakes import FakeClock
from tests.fakes.channels import FakeChannelAdapter, FakeChannelSessions, FakeMessages
from tests.unit.test_inbox import ALICE, ROOM, agent

KEY = bytes(range(32))
SID, OTHER = "a2u5k8gguri5", "otherses0001"
TABLES = ("channel_messages", "deliveries", "channel_sessions", "channel_receiving")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    store = StateStore(tmp_path / "state.db", KEY)
    yield store
    store.close()


def _talk(records: ChannelState, sid: str, events: range) -> None:
    """Channel messages of ``sid`` answered and delivered, and one receive in flight."""
    records.set_channel_session("chat", ROOM, f"chat:{sid}", sid)
    for n in events:
        records.begin_receive(Receiving("chat", f"$e{n}", sid, f"ch-{n}", ROOM, "", ALICE, "hi"))
        records.complete_receive(ChannelMessage(sid, n, "chat", ROOM, "", f"$e{n}", ALICE))
        records.add_delivery(Delivery(sid, n, "chat", "delivered"))
    records.begin_receive(Receiving("chat", f"$late-{sid}", sid, "ch-l", ROOM, "", ALICE, "hi"))


def _rows(store: StateStore, sid: str) -> dict[str, int]:
    with store.shared("counting") as db:
        return {t: db.execute(f"SELECT count(*) FROM {t} WHERE sid = ?", (sid,)).fetchone()[0]
                for t in TABLES}  # fmt: skip


def test_a_removed_sessions_channel_rows_go_and_its_event_ids_stay(store: StateStore) -> None:
    records = ChannelState(store)
    _talk(records, SID, range(1, 51))
    _talk(records, OTHER, range(51, 53))
    store.destroy_session_data(SID)  # what SessionService.remove does, then the record goes
    store.delete(SID)
    assert _rows(store, SID) == dict.fromkeys(TABLES, 0)
    assert _rows(store, OTHER) == {"channel_messages": 2, "deliveries": 2,
                                   "channel_sessions": 1, "channel_receiving": 1}  # fmt: skip
    assert records.channel_sids() == [OTHER]  # a start follows only sessions that exist
    # A later session of the same id starts afresh.
    assert (records.last_settled(SID), records.message(SID, 1)) == (0, None)
    assert records.channel_session("chat", ROOM, f"chat:{SID}") is None
    # The event offered again is still the message it was (its session and seq).
    again = records.message_by_event("chat", "$e7")
    assert again is not None
    assert (again.sid, again.seq) == (SID, 7)


def test_the_event_ids_kept_are_bounded(store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "KEEP_GONE_EVENTS", 30)
    records = ChannelState(store)
    _talk(records, SID, range(1, 51))
    _talk(records, OTHER, range(51, 71))
    store.destroy_session_data(SID)
    store.destroy_session_data(OTHER)
    with store.shared("counting") as db:
        kept = db.execute("SELECT count(*) FROM channel_events_gone").fetchone()[0]
    assert kept == 30
    assert records.message_by_event("chat", "$e70") is not None  # the newest stay
    assert records.message_by_event("chat", "$e41") is not None
    assert records.message_by_event("chat", "$e40") is None


def test_an_event_offered_again_after_its_sessions_removal_is_a_duplicate(
    store: StateStore,
) -> None:
    async def go() -> tuple[Admission, Admission, int]:
        sessions = FakeChannelSessions()
        adapter = FakeChannelAdapter("chat", "matrix")
        inbox = Inbox(records=ChannelState(store), messages=FakeMessages(sessions),
                      sessions=sessions, agents={"helper": agent()}, adapters={"chat": adapter},
                      clock=FakeClock())  # fmt: skip
        await inbox.start()
        try:
            await adapter.inject("hello", sender=ALICE, where=ROOM, event_id="$1")
            first = adapter.last_receipt
            store.destroy_session_data(first.sid)  # removed by an operator
            del sessions.sessions[first.sid]
            await adapter.inject("hello", sender=ALICE, where=ROOM, event_id="$1")
            return first.admission, adapter.last_receipt.admission, len(sessions.sessions)
        finally:
            await inbox.stop()

    assert asyncio.run(go()) == (Admission.QUEUED, Admission.DUPLICATE, 0)


def test_a_schema_6_database_drops_what_removed_sessions_left(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with pytest.MonkeyPatch.context() as patch:  # a state DB of schema 6, filled as it was
        patch.setattr(state, "SCHEMA_VERSION", 6)
        old = StateStore(path, KEY)
        with old.shared("inserting a session as schema 6 did") as db:  # SID was removed
            db.execute(
                "INSERT INTO sessions (sid, agent, state, created_at, updated_at, last_active_at) "
                "VALUES (?, 'helper', 'running', 1.0, 1.0, 1.0)",
                (OTHER,),
            )
        records = ChannelState(old)
        for sid, events in ((SID, range(1, 4)), (OTHER, range(4, 6))):
            records.set_channel_session("chat", ROOM, f"chat:{sid}", sid)
            for n in events:
                records.complete_receive(ChannelMessage(sid, n, "chat", ROOM, "", f"$e{n}", ALICE))
                records.add_delivery(Delivery(sid, n, "chat", "delivered"))
        old.close()
    store = StateStore(path, KEY)
    try:
        records = ChannelState(store)
        assert records.channel_sids() == [OTHER]
        assert _rows(store, SID) == dict.fromkeys(TABLES, 0)
        assert _rows(store, OTHER)["deliveries"] == 2
        gone = records.message_by_event("chat", "$e2")
        assert gone is not None
        assert (gone.sid, gone.seq) == (SID, 2)
    finally:
        store.close()
