"""``Inbox``: the ``InboxSink`` every channel adapter hands its messages to (docs/channels.md).

A message is routed by (channel, where) over the agents' wiring, admitted by the agent's
permissions (drop, or hold for an operator: services/inbox_held.py, which also holds one whose
receive keeps failing), engaged by the route's rule, and sent to the session its route's
session key names (services/inbox_sessions.py) through ``MessageService.send`` with a client id
derived from the channel's event id: that id's uniqueness in the session's queue is the durable
de-duplication. Receiving is a redo log (ports/channel_records.py), so a daemon killed between
any two steps loses and duplicates nothing (services/inbox_receive.py). Replies go back through
``Deliverer`` (services/inbox_delivery.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.channels import Route, admission, engages
from ironclawd.domain.checks import CheckResult, failed, passed
from ironclawd.domain.message_ids import MessageId, message_id
from ironclawd.domain.messages import check_body
from ironclawd.errors import (
    DiskFull,
    InvalidArgument,
    IronclawError,
    NotFound,
)
from ironclawd.ports import Clock
from ironclawd.ports.channel_records import (
    ChannelRecords,
    Delivery,
    HeldMessage,
    Receiving,
)
from ironclawd.ports.channels import (
    Admission,
    ChannelAdapter,
    ChannelStatus,
    InboundEvent,
    Receipt,
)
from ironclawd.services.inbox_delivery import Deliverer, MessagePort
from ironclawd.services.inbox_held import HeldMessages
from ironclawd.services.inbox_receive import Receives
from ironclawd.services.inbox_sessions import ChannelSessions, SessionPort

log = logging.getLogger("ironclawd.inbox")

RECENT_FAILURES = 5
# A message whose receive raised this many times (the channel offering it again after each) is
# held for an operator instead: one that can never be taken (its agent's sessions cannot start)
# must not stop its channel (Matrix hands every room of a sync over together).
MAX_RECEIVE_TRIES = 5
MAX_FAILING_EVENTS = 1024  # events remembered with their failed tries


def client_id(channel: str, event_id: str) -> str:
    """The queue's de-duplication key of a channel event (stable across restarts)."""
    digest = hashlib.sha256(f"{channel}\0{event_id}".encode("utf-8", "surrogatepass"))
    return "ch-" + digest.hexdigest()[:40]


@dataclass(frozen=True)
class ChannelReport:
    status: ChannelStatus
    deliveries: Mapping[str, int]  # by state (ports/channel_records.py DELIVERY_STATES)
    held: int
    failures: tuple[Delivery, ...]  # the newest failed or retrying deliveries


class Inbox:
    def __init__(
        self,
        *,
        records: ChannelRecords,
        messages: MessagePort,
        sessions: SessionPort,
        agents: Mapping[str, AgentSpec],
        adapters: Mapping[str, ChannelAdapter],
        clock: Clock,
        deliverer: Deliverer | None = None,
    ) -> None:
        self._records = records
        self._messages = messages
        self._agents = agents
        self.adapters = dict(adapters)
        self._clock = clock
        self.deliverer = deliverer or Deliverer(
            records=records, messages=messages, adapters=self.adapters, clock=clock
        )
        self._channel_sessions = ChannelSessions(records, sessions)
        self._receives = Receives(records, messages, self.deliverer)
        self._holds = HeldMessages(records, self._receives, clock, self._count)
        self._failed_tries: dict[tuple[str, str], int] = {}  # (channel, event id): receives raised
        self._counters: dict[str, Counter[str]] = {}  # per channel, shown with its adapter's
        self.deliverer.finish_receives = self._receives.finish

    # -- InboxSink -------------------------------------------------------------------------

    async def receive(self, event: InboundEvent) -> Receipt:
        try:
            check_body(event.text)
        except InvalidArgument as exc:
            return Receipt(Admission.REFUSED, reason=str(exc))
        done = self._records.message_by_event(event.channel, event.event_id)
        if done is not None:
            return Receipt(Admission.DUPLICATE, done.seq, done.sid)
        found = self.route(event.channel, event.where)
        if found is None:
            return Receipt(Admission.NOT_WIRED, reason=f"nothing is wired to {event.where!r}")
        key = (event.channel, event.event_id)
        tries = self._failed_tries.get(key, 0)
        if tries >= MAX_RECEIVE_TRIES:  # offered again: held (or dropped), not tried again
            return self._holds.hold_failed(event, tries, None)
        try:
            receipt = await self._admit(event, *found)
        except DiskFull:
            raise  # the whole channel waits for space, and nothing is counted against this one
        except IronclawError as exc:
            tries += 1
            self._failed_tries.pop(key, None)
            if len(self._failed_tries) >= MAX_FAILING_EVENTS:
                del self._failed_tries[next(iter(self._failed_tries))]  # the oldest
            self._failed_tries[key] = tries
            if tries < MAX_RECEIVE_TRIES:
                raise
            return self._holds.hold_failed(event, tries, exc)
        self._failed_tries.pop(key, None)
        return receipt

    def _count(self, channel: str, name: str) -> None:
        self._counters.setdefault(channel, Counter())[name] += 1

    async def _admit(self, event: InboundEvent, spec: AgentSpec, route: Route) -> Receipt:
        decision = admission(spec.permissions, f"{event.channel}:{event.sender}")
        if decision == "drop":
            log.info("channel %s: dropped a message from %r", event.channel, event.sender)
            return Receipt(Admission.DROPPED, reason="this sender may not talk to this agent")
        if decision == "hold":
            return self._holds.hold_stranger(event)
        if not engages(route, event.text, event.mentioned):
            return Receipt(Admission.NOT_ENGAGED)
        return await self._queue(event, spec, route)

    def screen(self, channel: str, where: str, sender: str) -> Admission | None:
        found = self.route(channel, where)
        if found is None:
            return Admission.NOT_WIRED
        if admission(found[0].permissions, f"{channel}:{sender}") == "drop":
            return Admission.DROPPED
        return None

    def wired(self, channel: str) -> frozenset[str]:
        return frozenset(
            r.where for spec in self._agents.values() for r in spec.wiring if r.channel == channel
        )

    async def cursor(self, channel: str) -> str | None:
        return await asyncio.to_thread(self._records.cursor, channel)

    async def save_cursor(self, channel: str, cursor: str) -> None:
        await asyncio.to_thread(self._records.save_cursor, channel, cursor)

    # -- routing and queueing --------------------------------------------------------------

    def route(self, channel: str, where: str) -> tuple[AgentSpec, Route] | None:
        """The agent wired to (channel, where) and its route; None when nothing is."""
        for spec in self._agents.values():
            for route in spec.wiring:
                if route.channel == channel and route.where == where:
                    return spec, route
        return None

    async def _queue(
        self,
        event: InboundEvent,
        spec: AgentSpec,
        route: Route,
        sending: Callable[[str], None] | None = None,
    ) -> Receipt:
        """Queue ``event`` for its session (made if need be); ``sending(sid)`` is told the
        session before the message is handed to it."""
        cid = client_id(event.channel, event.event_id)
        kept = next(
            (r for r in self._records.receiving() if r.channel == event.channel
             and r.event_id == event.event_id),
            None,
        )  # fmt: skip
        if kept is None:
            sid = await self._channel_sessions.session_for(event, spec.name, route)
            kept = self._records.begin_receive(
                Receiving(
                    event.channel, event.event_id, sid, cid, event.where, event.thread,
                    event.sender, event.text, route.reply_url,
                )
            )  # fmt: skip
        if sending is not None:
            sending(kept.sid)
        return await self._receives.complete(kept)

    async def resume(self) -> None:
        """After a restart: finish the receives a dead daemon left, then follow every channel
        session's replies (deliveries pending resume with their own delivery ids)."""
        await self._receives.resume()
        for sid in self._records.channel_sids():
            self.deliverer.follow(sid)

    # -- held messages (operator) ----------------------------------------------------------

    def held(self, after: int = 0, limit: int = -1) -> list[HeldMessage]:
        return self._records.held(after, limit)

    async def admit(
        self,
        held_id: int,
        sending: Callable[[str], None] | None = None,
        check: Callable[[AgentSpec], None] | None = None,
    ) -> Receipt:
        """Queue a held message as if its sender were allowed (the route must still exist);
        ``check(spec)`` may refuse (by raising) once the agent is known, before anything
        changes; ``sending(sid)`` is told its session before it is handed over."""
        h = self._records.get_held(held_id)
        found = self.route(h.channel, h.where)
        if check is not None and found is not None:
            check(found[0])
        done = self._records.message_by_event(h.channel, h.event_id)
        if done is None:
            if found is None:
                raise NotFound(
                    f"held message {held_id}: nothing is wired to {h.where!r} on channel "
                    f"{h.channel} any more (drop it: ironctl channel drop {held_id})"
                )
            event = InboundEvent(h.channel, h.event_id, h.sender, h.where, h.text, h.thread,
                                 h.mentioned, h.received_at)  # fmt: skip
            receipt = await self._queue(event, *found, sending=sending)
        else:
            receipt = Receipt(Admission.DUPLICATE, done.seq, done.sid)
        self._records.delete_held(held_id)
        self._failed_tries.pop((h.channel, h.event_id), None)
        return receipt

    def drop_held(self, held_id: int) -> HeldMessage:
        """Discard a held message (``HeldMessages.drop``)."""
        h = self._holds.drop(held_id)
        self._failed_tries.pop((h.channel, h.event_id), None)
        return h

    # -- status ----------------------------------------------------------------------------

    def adapter(self, name: str) -> ChannelAdapter:
        try:
            return self.adapters[name]
        except KeyError:
            known = ", ".join(sorted(self.adapters)) or "none configured"
            raise NotFound(f"channel '{name}' not found (channels: {known})") from None

    def report(self, name: str) -> ChannelReport:
        status = self.adapter(name).status()
        if name in self._counters:
            status = replace(status, counters={**status.counters, **self._counters[name]})
        held = self._records.held_count(name)
        return ChannelReport(
            status,
            self._records.delivery_counts(name),
            held,
            tuple(self._records.failed_deliveries(name, RECENT_FAILURES)),
        )

    def reports(self) -> list[ChannelReport]:
        return [self.report(name) for name in sorted(self.adapters)]

    def checks(self) -> list[CheckResult]:
        """``ironctl doctor``: each channel connected, else its last error (not required: the
        host can still run sandboxes)."""
        results = []
        for name in sorted(self.adapters):
            s = self.adapters[name].status()
            check = f"channel.{name}"
            if s.connected:
                results.append(passed(check, f"{s.kind} {s.detail}: connected", required=False))
            else:
                results.append(failed(
                    check, f"{s.kind} {s.detail}: not connected: {s.last_error or 'starting'}",
                    f"ironctl channel test {name}; see journalctl -u ironclawd", required=False,
                ))  # fmt: skip
        return results

    async def start(self) -> None:
        """Start every channel; one that cannot start is logged (doctor and ``ironctl channel
        show`` say why) and the others run."""
        for adapter in self.adapters.values():
            try:
                await adapter.start(self)
            except IronclawError as exc:
                log.error(
                    "channel %s: not started: %s",
                    adapter.name,
                    exc,
                    extra=message_id(MessageId.CHANNEL_FAILED, IRONCLAW_CHANNEL=adapter.name),
                )

    async def stop(self) -> None:
        for adapter in self.adapters.values():
            try:
                await adapter.stop()
            except IronclawError as exc:
                log.warning("channel %s: stopping: %s", adapter.name, exc)
        await self.deliverer.stop()
