"""``ports.ChannelAdapter`` and ``ports.ChannelRecords``: the in-memory fakes
(tests/fakes/channels.py) keep the same contract as the real adapters (the channel contract in
tests/contract/channel_contract.py, which the Matrix and webhook integration tests run too)
and the state DB's tables (store/channel_state.py on a real SQLCipher file in a tmp dir)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from ironclawd.errors import NotFound
from ironclawd.ports.channel_records import (
    ChannelMessage,
    ChannelRecords,
    Delivery,
    HeldMessage,
    Receiving,
)
from ironclawd.store.channel_state import ChannelState
from ironclawd.store.state import StateStore
from tests.contract.channel_contract import check_contract
from tests.fakes.channels import FakeChannelAdapter, MemoryChannelRecords

KEY = bytes(range(32))


class FakePeer:
    where = "!room:test"
    sender = "@alice:test"
    reply_url = ""

    def __init__(self, adapter: FakeChannelAdapter) -> None:
        self._adapter = adapter

    async def send(self, text: str) -> str:
        event_id = f"$e{len(self._adapter.acked) + 1}"
        while True:  # a sender that retries what was not acknowledged, with the same id
            try:
                return await self._adapter.inject(
                    text, sender=self.sender, where=self.where, event_id=event_id
                )
            except Exception:
                continue

    async def shown(self) -> list[str]:
        return [r.text for r in self._adapter.shown.values()]


def test_the_fake_adapter_keeps_the_channel_contract() -> None:
    adapter = FakeChannelAdapter("chat", "matrix")
    asyncio.run(check_contract(adapter, FakePeer(adapter)))


@pytest.fixture(params=["memory", "state-db"])
def records(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ChannelRecords]:
    if request.param == "memory":
        yield MemoryChannelRecords()
        return
    store = StateStore(tmp_path / "state.db", KEY)
    try:
        yield ChannelState(store)
    finally:
        store.close()


def test_cursors_and_sessions(records: ChannelRecords) -> None:
    assert records.cursor("chat") is None
    records.save_cursor("chat", "s1")
    records.save_cursor("chat", "s2")
    assert records.cursor("chat") == "s2"
    assert records.channel_session("chat", "!r", "chat:@a") is None
    records.set_channel_session("chat", "!r", "chat:@a", "sid1")
    records.set_channel_session("chat", "!r", "chat:@a", "sid2")
    assert records.channel_session("chat", "!r", "chat:@a") == "sid2"
    assert records.channel_session("chat", "!other", "chat:@a") is None
    records.set_channel_session("chat", "!r", "!r/$t1", "sid3")
    assert records.channel_sessions("chat", "!r") == ["sid3", "sid2"]  # by key
    assert records.channel_sessions("chat", "!none") == []


def test_receiving_is_kept_once_and_completed_into_a_message(records: ChannelRecords) -> None:
    first = Receiving("chat", "$1", "sid1", "ch-x", "!r", "", "@a", "hello", "")
    assert records.begin_receive(first) == first
    # A retry that routed elsewhere gets the kept row (and its session) back.
    assert records.begin_receive(Receiving("chat", "$1", "sid2", "ch-x", "!r", "", "@a",
                                           "hello", "")) == first  # fmt: skip
    assert records.receiving() == [first]
    assert records.has_receiving("sid1")
    assert not records.has_receiving("sid2")
    message = ChannelMessage("sid1", 7, "chat", "!r", "", "$1", "@a", "")
    records.complete_receive(message)
    records.complete_receive(message)  # idempotent
    assert records.receiving() == []
    assert records.message("sid1", 7) == message
    assert records.message_by_event("chat", "$1") == message
    assert records.message_by_event("other", "$1") is None
    assert records.channel_sids() == ["sid1"]
    records.begin_receive(Receiving("chat", "$2", "sid1", "ch-y", "!r", "", "@a", "x", ""))
    records.forget_receive("chat", "$2")
    assert records.receiving() == []


def test_held_messages(records: ChannelRecords) -> None:
    held = HeldMessage(0, "chat", "!r", "@eve", "$9", "", "let me in", True, 5.0)
    kept = records.hold(held, 10, 1000)
    assert kept is not None
    assert kept.id > 0
    assert kept.text == "let me in"
    assert kept.mentioned
    assert records.hold(held, 10, 1000) == kept  # the same event held once
    assert records.held() == [kept]
    assert records.held_count("chat") == 1
    assert records.get_held(kept.id) == kept
    records.delete_held(kept.id)
    assert records.held() == []
    assert records.held_count("chat") == 0
    with pytest.raises(NotFound, match="held message"):
        records.get_held(kept.id)


def test_held_messages_are_capped_per_channel_by_count_and_bytes(
    records: ChannelRecords,
) -> None:
    def hold(channel: str, event_id: str, text: str) -> HeldMessage | None:
        held = HeldMessage(0, channel, "!r", "@eve", event_id, "", text, False, 5.0)
        return records.hold(held, 3, 10)

    first = hold("chat", "$1", "ab")
    assert first is not None
    assert hold("chat", "$2", "é" * 4) is not None  # 8 bytes of UTF-8: 10 in all
    assert hold("chat", "$3", "c") is None  # 11 bytes: nothing kept
    assert hold("chat", "$1", "ab") == first  # held already: still the one kept
    assert hold("other", "$3", "c") is not None  # another channel's count and bytes
    records.delete_held(first.id)
    assert hold("chat", "$3", "c") is not None
    assert hold("chat", "$4", "d") is not None
    assert hold("chat", "$5", "e") is None  # 3 messages
    assert [h.event_id for h in records.held() if h.channel == "chat"] == ["$2", "$3", "$4"]
    assert records.held_count("chat") == 3


def test_held_messages_are_listed_a_page_at_a_time(records: ChannelRecords) -> None:
    kept = []
    for n in range(5):
        held = HeldMessage(0, "chat", "!r", "@eve", f"${n}", "", f"m{n}", False, 5.0)
        one = records.hold(held, 10, 1000)
        assert one is not None
        kept.append(one)
    assert records.held(0, 2) == kept[:2]
    assert records.held(kept[1].id, 2) == kept[2:4]
    assert records.held(kept[3].id) == kept[4:]
    assert records.held(kept[4].id, 2) == []


def test_deliveries(records: ChannelRecords) -> None:
    assert records.last_settled("sid1") == 0
    pending = Delivery("sid1", 1, "chat", "pending", updated_at=1.0)
    assert records.add_delivery(pending) == pending
    assert records.add_delivery(Delivery("sid1", 1, "chat", "skipped")) == pending
    records.add_delivery(Delivery("sid1", 2, "", "skipped"))
    assert records.last_settled("sid1") == 2
    assert records.pending_deliveries("sid1") == [pending]
    retrying = Delivery("sid1", 1, "chat", "pending", 1, 9.0, "503 from the homeserver", 2.0)
    records.save_delivery(retrying)
    assert records.failed_deliveries("chat", 5) == [retrying]
    done = Delivery("sid1", 1, "chat", "delivered", 2, 0.0, "", 3.0)
    records.save_delivery(done)
    assert records.pending_deliveries("sid1") == []
    assert records.failed_deliveries("chat", 5) == []
    records.add_delivery(Delivery("sid1", 3, "chat", "failed", 1, 0.0, "M_FORBIDDEN", 4.0))
    assert records.delivery_counts("chat") == {"delivered": 1, "failed": 1}
    assert [d.reply_seq for d in records.failed_deliveries("chat", 5)] == [3]
