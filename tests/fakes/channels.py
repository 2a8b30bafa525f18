"""Channel fakes for the unit tier: an in-memory ``ChannelAdapter`` (held to the same contract
as the Matrix and webhook adapters: tests/contract/channel_contract.py), ``ChannelRecords`` in
memory (held to the state DB's by tests/contract/test_channels.py), and the message and session
services the inbox drives, reduced to what it uses."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ironclawd.domain.messages import Reply, check_body, check_client_id
from ironclawd.domain.session import Session, State, check_sid, new_sid
from ironclawd.errors import ChannelFailed, HostError, NotFound
from ironclawd.ports.channel_records import ChannelMessage, Delivery, HeldMessage, Receiving
from ironclawd.ports.channels import ChannelStatus, InboundEvent, InboxSink, OutboundReply


class FakeChannelAdapter:
    """A channel whose "server" is this object: ``inject`` is a message arriving (acknowledged
    only when the sink returned), ``shown`` what the other side sees of the replies (a
    delivery id shown once, like Matrix txn ids and webhook receivers de-duplicate)."""

    def __init__(self, name: str = "chat", kind: str = "matrix") -> None:
        self.name = name
        self.kind = kind
        self.sink: InboxSink | None = None
        self.acked: list[str] = []  # event ids acknowledged to the channel, in order
        self.deliveries: list[OutboundReply] = []  # every deliver call, repeats included
        self.shown: dict[str, OutboundReply] = {}  # delivery id -> reply, first one kept
        self.failures: list[ChannelFailed] = []  # raised by the next deliver calls, in order
        self.stopped = 0
        self.delivered = asyncio.Event()  # set by the first deliver call
        self._next = 0

    async def start(self, sink: InboxSink) -> None:
        self.sink = sink

    async def stop(self) -> None:
        self.sink = None
        self.stopped += 1

    async def inject(
        self,
        text: str,
        *,
        sender: str = "@alice:test",
        where: str = "!room:test",
        event_id: str = "",
        thread: str = "",
        mentioned: bool = False,
    ) -> str:
        """A message arrives; returns its event id once the sink took it (an error from the
        sink propagates and nothing is acknowledged)."""  # fmt: skip
        if self.sink is None:
            raise ChannelFailed(f"channel {self.name}: not started")
        if not event_id:
            self._next += 1
            event_id = f"$ev{self._next}"
        event = InboundEvent(self.name, event_id, sender, where, text, thread, mentioned, 1.0)
        self.last_receipt = await self.sink.receive(event)
        self.acked.append(event_id)
        return event_id

    async def deliver(self, reply: OutboundReply) -> None:
        self.deliveries.append(reply)
        self.delivered.set()
        if self.failures:
            raise self.failures.pop(0)
        self.shown.setdefault(reply.delivery_id, reply)

    def status(self) -> ChannelStatus:
        return ChannelStatus(
            self.name, self.kind, self.sink is not None, "fake",
            counters={"acked": len(self.acked), "delivered": len(self.shown)},
        )  # fmt: skip

    async def test(self) -> str:
        return f"fake channel {self.name}: nothing to check"


@dataclass
class MemoryChannelRecords:
    """``ports.ChannelRecords`` in memory. ``crash[name]`` makes the next call of that method
    raise (a daemon killed there: nothing of the call is kept)."""

    cursors: dict[str, str] = field(default_factory=dict)
    sessions: dict[tuple[str, str, str], str] = field(default_factory=dict)
    receiving_rows: dict[tuple[str, str], Receiving] = field(default_factory=dict)
    messages: dict[tuple[str, int], ChannelMessage] = field(default_factory=dict)
    held_rows: dict[int, HeldMessage] = field(default_factory=dict)
    deliveries: dict[tuple[str, int], Delivery] = field(default_factory=dict)
    crash: set[str] = field(default_factory=set)
    _held_id: int = 0

    def _maybe_crash(self, name: str) -> None:
        if name in self.crash:
            self.crash.discard(name)
            raise HostError(f"simulated crash in {name}")

    def cursor(self, channel: str) -> str | None:
        return self.cursors.get(channel)

    def save_cursor(self, channel: str, cursor: str) -> None:
        self.cursors[channel] = cursor

    def channel_session(self, channel: str, where: str, key: str) -> str | None:
        return self.sessions.get((channel, where, key))

    def set_channel_session(self, channel: str, where: str, key: str, sid: str) -> None:
        self.sessions[(channel, where, key)] = sid

    def channel_sessions(self, channel: str, where: str) -> list[str]:
        return [
            sid for (c, w, _k), sid in sorted(self.sessions.items()) if (c, w) == (channel, where)
        ]

    def begin_receive(self, receiving: Receiving) -> Receiving:
        self._maybe_crash("begin_receive")
        return self.receiving_rows.setdefault((receiving.channel, receiving.event_id), receiving)

    def receiving(self) -> list[Receiving]:
        return list(self.receiving_rows.values())

    def has_receiving(self, sid: str) -> bool:
        return any(r.sid == sid for r in self.receiving_rows.values())

    def complete_receive(self, message: ChannelMessage) -> None:
        self._maybe_crash("complete_receive")
        self.messages.setdefault((message.sid, message.seq), message)
        self.receiving_rows.pop((message.channel, message.event_id), None)

    def forget_receive(self, channel: str, event_id: str) -> None:
        self.receiving_rows.pop((channel, event_id), None)

    def message(self, sid: str, seq: int) -> ChannelMessage | None:
        return self.messages.get((sid, seq))

    def message_by_event(self, channel: str, event_id: str) -> ChannelMessage | None:
        return next(
            (m for m in self.messages.values() if (m.channel, m.event_id) == (channel, event_id)),
            None,
        )

    def channel_sids(self) -> list[str]:
        return sorted({m.sid for m in self.messages.values()})

    def hold(self, held: HeldMessage, max_rows: int, max_bytes: int) -> HeldMessage | None:
        for h in self.held_rows.values():
            if (h.channel, h.event_id) == (held.channel, held.event_id):
                return h
        sizes = [_size(h.text) for h in self.held_rows.values() if h.channel == held.channel]
        if len(sizes) >= max_rows or sum(sizes) + _size(held.text) > max_bytes:
            return None
        self._held_id += 1
        kept = dataclasses.replace(held, id=self._held_id)
        self.held_rows[kept.id] = kept
        return kept

    def held(self, after: int = 0, limit: int = -1) -> list[HeldMessage]:
        kept = [self.held_rows[k] for k in sorted(self.held_rows) if k > after]
        return kept if limit < 0 else kept[:limit]

    def held_count(self, channel: str) -> int:
        return sum(h.channel == channel for h in self.held_rows.values())

    def get_held(self, held_id: int) -> HeldMessage:
        try:
            return self.held_rows[held_id]
        except KeyError:
            raise NotFound(f"held message {held_id} not found") from None

    def delete_held(self, held_id: int) -> None:
        self.held_rows.pop(held_id, None)

    def add_delivery(self, delivery: Delivery) -> Delivery:
        return self.deliveries.setdefault((delivery.sid, delivery.reply_seq), delivery)

    def save_delivery(self, delivery: Delivery) -> None:
        self._maybe_crash("save_delivery")
        self.deliveries[(delivery.sid, delivery.reply_seq)] = delivery

    def last_settled(self, sid: str) -> int:
        return max((seq for s, seq in self.deliveries if s == sid), default=0)

    def pending_deliveries(self, sid: str) -> list[Delivery]:
        return sorted(
            (d for d in self.deliveries.values() if d.sid == sid and d.state == "pending"),
            key=lambda d: d.reply_seq,
        )

    def delivery_counts(self, channel: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for d in self.deliveries.values():
            if d.channel == channel:
                counts[d.state] = counts.get(d.state, 0) + 1
        return counts

    def failed_deliveries(self, channel: str, limit: int) -> list[Delivery]:
        rows = [
            d for d in self.deliveries.values()
            if d.channel == channel and (d.state == "failed" or (d.state == "pending"
                                                                  and d.last_error))
        ]  # fmt: skip
        return sorted(rows, key=lambda d: -d.updated_at)[:limit]


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class FakeSent:
    seq: int
    new: bool
    replies_before: int = 0


class FakeMessages:
    """Each session's inbound queue (client-id de-duplicated, like inbound.db) and replies;
    ``reply`` is the agent answering. ``crash_after_send`` makes the next send raise after the
    message was appended (a daemon killed right after the queue took it). It and
    ``FakeChannelSessions`` pass the real services' contract (tests/contract/
    test_inbox_ports.py)."""

    def __init__(self, sessions: FakeChannelSessions) -> None:
        self._sessions = sessions
        self.inbound: dict[str, list[tuple[str, str]]] = {}  # sid -> [(text, client id)]
        self.replies: dict[str, list[Reply]] = {}
        self.crash_after_send = False
        self._changed = asyncio.Condition()

    async def send(self, sid: str, body: str, client_id: str = "") -> FakeSent:
        check_body(body)
        check_client_id(client_id)
        self._sessions.get(sid)
        queue = self.inbound.setdefault(sid, [])
        for index, (_text, cid) in enumerate(queue):
            if client_id and cid == client_id:
                return FakeSent(index + 1, False)
        queue.append((body, client_id))
        if self.crash_after_send:
            self.crash_after_send = False
            raise HostError("simulated crash after the queue took the message")
        return FakeSent(len(queue), True)

    async def reply(self, sid: str, in_reply_to: int, body: str) -> Reply:
        rows = self.replies.setdefault(sid, [])
        reply = Reply(len(rows) + 1, in_reply_to, 2.0, body, b"")
        rows.append(reply)
        async with self._changed:
            self._changed.notify_all()
        return reply

    async def watch(self, sid: str, after: int, follow: bool) -> AsyncIterator[Reply]:
        self._sessions.get(sid)
        while True:
            batch = [r for r in self.replies.get(sid, []) if r.seq > after]
            if not batch:
                if not follow:
                    return
                async with self._changed:
                    await self._changed.wait()
                self._sessions.get(sid)
                continue
            for reply in batch:
                yield reply
                after = reply.seq


class FakeChannelSessions:
    pool: None = None  # no warm pool

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}

    def get(self, sid: str) -> Session:
        try:
            return self.sessions[check_sid(sid)]
        except KeyError:
            raise NotFound(f"session {sid} not found") from None

    async def create(self, agent: str, sid: str | None = None) -> Session:
        session = Session(sid or new_sid(), agent, State.RUNNING, 1.0, 1.0, 1.0)
        self.sessions[session.sid] = session
        return session
