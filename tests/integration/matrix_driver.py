"""The Matrix channel tests' side of the homeserver (tests/integration/test_matrix.py): the
accounts, a recording InboxSink, the channel under test, and Alice's matrix-nio client and what
she does (create rooms, talk, read), plus the peer the channel contract is run with."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import nio

from ironclawd.domain.channels import ChannelConfig
from ironclawd.errors import HostError, NotFound
from ironclawd.host.clock import SystemClock
from ironclawd.host.matrix import MatrixChannel
from ironclawd.ports.channels import (
    Admission,
    ChannelStatus,
    InboundEvent,
    InboxSink,
    OutboundReply,
    Receipt,
)
from tests.harness.synapse import Account, Homeserver

WAIT = 30.0  # seconds for anything the homeserver should do (it answers in milliseconds)


@dataclasses.dataclass(frozen=True)
class Server:
    hs: Homeserver
    alice: Account
    bob: Account
    bot: Account  # logged in on device IRONCLAW, as an operator would for the credential


class RecordingSink:
    """An InboxSink that records, in one list, every receive (and whether it raised) and every
    cursor save; ``fail`` makes the next receives raise, ``gate`` holds them."""

    def __init__(self) -> None:
        self.rooms: set[str] = set()
        self.log: list[tuple[str, str]] = []  # ("receive"|"raised", event_id) | ("save", cursor)
        self.events: list[InboundEvent] = []
        self.saved: str | None = None
        self.fail = 0
        self.gate: asyncio.Event | None = None
        self._changed = asyncio.Condition()

    async def receive(self, event: InboundEvent) -> Receipt:
        if self.gate is not None:
            self.log.append(("waiting", event.event_id))
            await self._note()
            await self.gate.wait()
        if self.fail:
            self.fail -= 1
            self.log.append(("raised", event.event_id))
            await self._note()
            raise HostError("inbound.db: disk I/O error (the test's)")
        self.log.append(("receive", event.event_id))
        self.events.append(event)
        await self._note()
        return Receipt(Admission.QUEUED, seq=len(self.events), sid="s1")

    def wired(self, channel: str) -> frozenset[str]:
        assert channel == "chat"
        return frozenset(self.rooms)

    def screen(self, channel: str, where: str, sender: str) -> Admission | None:
        return None

    async def cursor(self, channel: str) -> str | None:
        return self.saved

    async def save_cursor(self, channel: str, cursor: str) -> None:
        self.saved = cursor
        self.log.append(("save", cursor))
        await self._note()

    async def _note(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def until(self, done: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT), self._changed:
            await self._changed.wait_for(done)

    def texts(self) -> list[str]:
        return [e.text for e in self.events]


def channel_config(server: Server, **over: Any) -> ChannelConfig:
    return dataclasses.replace(
        ChannelConfig(
            name="chat", type="matrix", homeserver=server.hs.url, user_id=server.bot.user_id,
            token_credential="chat-token",
        ),
        **over,
    )  # fmt: skip


def secrets_of(server: Server) -> Callable[[str], str]:
    def secret(name: str) -> str:
        if name != "chat-token":
            raise NotFound(f"credential {name}")
        return server.bot.token

    return secret


@contextlib.asynccontextmanager
async def running(
    server: Server, sink: RecordingSink, timeline_limit: int = 100, **over: Any
) -> AsyncIterator[MatrixChannel]:
    config = channel_config(server, **over)
    channel = MatrixChannel(
        config, secrets_of(server), SystemClock(), timeline_limit=timeline_limit
    )
    await channel.start(sink)
    try:
        yield channel
    finally:
        await channel.stop()


@contextlib.asynccontextmanager
async def client_of(server: Server, account: Account) -> AsyncIterator[Any]:
    client = nio.AsyncClient(server.hs.url, account.user_id)
    client.restore_login(account.user_id, account.device_id, account.token)
    try:
        yield client
    finally:
        await client.close()


async def room_with_bot(alice: Any, server: Server) -> str:
    created = await alice.room_create(invite=[server.bot.user_id])
    assert isinstance(created, nio.RoomCreateResponse), created
    return str(created.room_id)


async def say(alice: Any, room: str, body: str, **content: Any) -> str:
    sent = await alice.room_send(
        room, "m.room.message", {"msgtype": "m.text", "body": body, **content}
    )
    assert isinstance(sent, nio.RoomSendResponse), sent
    return str(sent.event_id)


async def members(alice: Any, room: str) -> set[str]:
    got = await alice.joined_members(room)
    assert isinstance(got, nio.JoinedMembersResponse), got
    return {m.user_id for m in got.members}


class AckedSink:
    """Passes everything to the contract's sink and tells the peer which events the channel
    acknowledged: those received before a cursor save (Matrix's acknowledgement)."""

    def __init__(self, inner: InboxSink, peer: MatrixPeer) -> None:
        self._inner, self._peer = inner, peer
        self._taken: list[str] = []

    async def receive(self, event: InboundEvent) -> Receipt:
        receipt = await self._inner.receive(event)
        self._taken.append(event.event_id)
        return receipt

    def wired(self, channel: str) -> frozenset[str]:
        return self._inner.wired(channel)

    def screen(self, channel: str, where: str, sender: str) -> Admission | None:
        return self._inner.screen(channel, where, sender)

    async def cursor(self, channel: str) -> str | None:
        return await self._inner.cursor(channel)

    async def save_cursor(self, channel: str, cursor: str) -> None:
        await self._inner.save_cursor(channel, cursor)
        async with self._peer.changed:
            self._peer.acked.update(self._taken)
            self._taken.clear()
            self._peer.changed.notify_all()


class Watched:
    """The real channel, its sink wrapped in ``AckedSink``; everything else passed through."""

    def __init__(self, inner: MatrixChannel, peer: MatrixPeer) -> None:
        self.name, self.kind = inner.name, inner.kind
        self._inner, self._peer = inner, peer

    async def start(self, sink: InboxSink) -> None:
        await self._inner.start(AckedSink(sink, self._peer))

    async def stop(self) -> None:
        await self._inner.stop()

    async def deliver(self, reply: OutboundReply) -> None:
        await self._inner.deliver(reply)

    def status(self) -> ChannelStatus:
        return self._inner.status()

    async def test(self) -> str:
        return await self._inner.test()


class MatrixPeer:
    """Alice in a wired room: her message counts as acknowledged once the channel saved a
    cursor past it; the replies she sees are the bot's messages in the room."""

    reply_url = ""

    def __init__(self, alice: Any, room: str, sender: str, bot: str) -> None:
        self._alice, self.where, self.sender, self._bot = alice, room, sender, bot
        self.acked: set[str] = set()
        self.changed = asyncio.Condition()

    async def send(self, text: str) -> str:
        event_id = await say(self._alice, self.where, text)
        async with asyncio.timeout(WAIT), self.changed:
            await self.changed.wait_for(lambda: event_id in self.acked)
        return event_id

    async def shown(self) -> list[str]:
        page = await self._alice.room_messages(
            self.where, direction=nio.MessageDirection.back, limit=100
        )
        assert isinstance(page, nio.RoomMessagesResponse), page
        return [
            e.source["content"]["body"] for e in reversed(page.chunk)
            if e.sender == self._bot and e.source["type"] == "m.room.message"
        ]  # fmt: skip
