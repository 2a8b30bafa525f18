"""Every ``ChannelState`` method (store/channel_state.py) turns a driver error into a
``HostError`` naming what it was doing and the state DB, like the rest of the store."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ironclawd.errors import HostError
from ironclawd.ports.channel_records import ChannelMessage, Delivery, HeldMessage, Receiving
from ironclawd.store.channel_state import ChannelState
from ironclawd.store.state import StateStore

KEY = bytes(range(32))
RECEIVING = Receiving("chat", "$1", "sid1", "ch-1", "!r", "", "@a", "hi")
MESSAGE = ChannelMessage("sid1", 1, "chat", "!r", "", "$1", "@a")
HELD = HeldMessage(0, "chat", "!r", "@e", "$2", "", "hi", False, 1.0)
DELIVERY = Delivery("sid1", 1, "chat", "pending")

CALLS: dict[str, Callable[[ChannelState], Any]] = {
    "cursor": lambda c: c.cursor("chat"),
    "save_cursor": lambda c: c.save_cursor("chat", "s1"),
    "channel_session": lambda c: c.channel_session("chat", "!r", "k"),
    "set_channel_session": lambda c: c.set_channel_session("chat", "!r", "k", "sid1"),
    "channel_sessions": lambda c: c.channel_sessions("chat", "!r"),
    "begin_receive": lambda c: c.begin_receive(RECEIVING),
    "receiving": lambda c: c.receiving(),
    "has_receiving": lambda c: c.has_receiving("sid1"),
    "complete_receive": lambda c: c.complete_receive(MESSAGE),
    "forget_receive": lambda c: c.forget_receive("chat", "$1"),
    "message": lambda c: c.message("sid1", 1),
    "message_by_event": lambda c: c.message_by_event("chat", "$1"),
    "channel_sids": lambda c: c.channel_sids(),
    "hold": lambda c: c.hold(HELD, 10, 1000),
    "held_count": lambda c: c.held_count("chat"),
    "held": lambda c: c.held(),
    "get_held": lambda c: c.get_held(1),
    "delete_held": lambda c: c.delete_held(1),
    "add_delivery": lambda c: c.add_delivery(DELIVERY),
    "save_delivery": lambda c: c.save_delivery(DELIVERY),
    "last_settled": lambda c: c.last_settled("sid1"),
    "pending_deliveries": lambda c: c.pending_deliveries("sid1"),
    "delivery_counts": lambda c: c.delivery_counts("chat"),
    "failed_deliveries": lambda c: c.failed_deliveries("chat", 5),
}


def test_the_calls_cover_every_public_method() -> None:
    public = {n for n, _ in inspect.getmembers(ChannelState, inspect.isfunction) if n[0] != "_"}
    assert public == set(CALLS)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_method_translates_a_driver_error(tmp_path: Path, name: str) -> None:
    store = StateStore(tmp_path / "state.db", KEY)
    store._db.close()
    with pytest.raises(HostError, match=rf" in state DB {tmp_path}/state\.db: ") as caught:
        CALLS[name](ChannelState(store))
    assert type(caught.value) is HostError
    store.close()


def test_a_failed_write_leaves_no_transaction_open(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db", KEY)
    store._db.execute("PRAGMA query_only = ON")
    with pytest.raises(HostError, match="receiving event of channel chat"):
        ChannelState(store).begin_receive(RECEIVING)
    assert not store._db.in_transaction
