"""The contract every ``ChannelAdapter`` keeps (ironclawd/ports/channels.py), as one function:
the in-memory fake (tests/contract/test_channels.py) and the real Matrix and webhook adapters
(their integration tests, with a real homeserver or real HTTP) are all held to it.

A ``ChannelPeer`` is the other side of the channel for one test: a person posting in a wired
room, or a service POSTing signed webhooks, retrying as such a sender does when the channel did
not acknowledge; and whatever shows that side the replies."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from ironclawd.errors import HostError
from ironclawd.ports.channels import (
    Admission,
    ChannelAdapter,
    InboundEvent,
    OutboundReply,
    Receipt,
)

# Hostile text survives unchanged: newlines, a right-to-left override, a zero-width joiner.
HOSTILE = "line one\nline two \u202eevil\u202c \u200d end"


class ChannelPeer(Protocol):
    where: str  # the room or endpoint the peer talks in (wired in the sink)
    sender: str  # the raw identity the channel asserts for the peer's messages
    reply_url: str  # where replies go for webhook routes ("" for Matrix)

    async def send(self, text: str) -> str:
        """Post ``text``; return the channel's event id once the adapter acknowledged it,
        retrying as the channel's senders do while it does not."""
        ...

    async def shown(self) -> list[str]:
        """The reply texts this side of the channel has seen, in order, each once."""
        ...


@dataclass
class RecordingSink:
    """An ``InboxSink`` that keeps every event; ``fail_next`` receives raise first."""

    wired_where: frozenset[str]
    events: list[InboundEvent] = field(default_factory=list)
    accepted: list[InboundEvent] = field(default_factory=list)
    cursors: dict[str, str] = field(default_factory=dict)
    fail_next: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def receive(self, event: InboundEvent) -> Receipt:
        self.events.append(event)
        self.arrived.set()
        if self.fail_next:
            self.fail_next -= 1
            raise HostError("the inbox could not store the message (simulated)")
        self.accepted.append(event)
        return Receipt(Admission.QUEUED, len(self.accepted), "sid0000001")

    def wired(self, channel: str) -> frozenset[str]:
        return self.wired_where

    def screen(self, channel: str, where: str, sender: str) -> Admission | None:
        return None

    async def cursor(self, channel: str) -> str | None:
        return self.cursors.get(channel)

    async def save_cursor(self, channel: str, cursor: str) -> None:
        self.cursors[channel] = cursor


async def check_contract(adapter: ChannelAdapter, peer: ChannelPeer) -> None:
    """Every clause, in order, against a started-here adapter; stops it at the end."""
    assert adapter.kind in ("matrix", "webhook"), adapter.kind
    sink = RecordingSink(frozenset({peer.where}))
    await adapter.start(sink)
    try:
        status = adapter.status()
        assert (status.name, status.kind) == (adapter.name, adapter.kind), status
        assert status.connected, status

        # A message reaches the sink once, as the peer sent it, named by the channel.
        event_id = await peer.send(HOSTILE)
        (event,) = sink.accepted
        assert (event.channel, event.event_id, event.sender, event.where, event.text) == (
            adapter.name, event_id, peer.sender, peer.where, HOSTILE,
        ), event  # fmt: skip

        # A sink that raised acknowledged nothing: the same event comes again, taken once.
        sink.fail_next = 1
        again = await peer.send("second")
        tries = [e.event_id for e in sink.events if e.text == "second"]
        assert tries == [again, again], tries
        assert [e.event_id for e in sink.accepted] == [event_id, again]

        # The same delivery id twice shows the reply once.
        reply = OutboundReply(
            "sid0000001-1", adapter.name, peer.where, "", event_id, "the reply", peer.reply_url
        )
        await adapter.deliver(reply)
        await adapter.deliver(reply)
        other = OutboundReply(
            "sid0000001-2", adapter.name, peer.where, "", again, "another", peer.reply_url
        )
        await adapter.deliver(other)
        assert await peer.shown() == ["the reply", "another"]

        assert isinstance(await adapter.test(), str)
    finally:
        await adapter.stop()
    await adapter.stop()  # idempotent
