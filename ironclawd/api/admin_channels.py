"""Admin RPCs for channels (docs/channels.md): their status and failed deliveries, an end-to-end
test of one, and the messages held for an operator to admit or drop (each decision audited)."""

from __future__ import annotations

import re
from typing import Any

import grpc

from ironclaw.admin.v1 import admin_pb2
from ironclawd.api.admin_changes import may_talk, operator, require_talk
from ironclawd.domain.channels import sender_event_id
from ironclawd.errors import InvalidArgument
from ironclawd.ports.channel_records import HeldMessage
from ironclawd.services.audit import Audit
from ironclawd.services.inbox import ChannelReport, Inbox
from ironclawd.services.messaging import MessageService

Context = grpc.aio.ServicerContext[Any, Any]


class ChannelsMixin:
    _inbox: Inbox
    _audit_trail: Audit
    _messages: MessageService

    async def ListChannels(
        self, request: admin_pb2.ListChannelsRequest, context: Context
    ) -> admin_pb2.ListChannelsResponse:
        return admin_pb2.ListChannelsResponse(
            channels=[channel_to_proto(r) for r in self._inbox.reports()]
        )

    async def GetChannel(
        self, request: admin_pb2.GetChannelRequest, context: Context
    ) -> admin_pb2.GetChannelResponse:
        return admin_pb2.GetChannelResponse(
            channel=channel_to_proto(self._inbox.report(_name(request.name)))
        )

    async def TestChannel(
        self, request: admin_pb2.TestChannelRequest, context: Context
    ) -> admin_pb2.TestChannelResponse:
        adapter = self._inbox.adapter(_name(request.name))
        return admin_pb2.TestChannelResponse(detail=await adapter.test())

    async def ListHeld(
        self, request: admin_pb2.ListHeldRequest, context: Context
    ) -> admin_pb2.ListHeldResponse:
        limit = request.limit or HELD_PAGE
        if limit > HELD_PAGE_MAX:
            raise InvalidArgument(f"limit: expected at most {HELD_PAGE_MAX}, not {limit}")
        # One page, not every channel's held messages: 1,000 a channel of up to 16 KiB each
        # passed gRPC's 4 MiB answer from about three full channels (found by a review).
        rows = self._inbox.held(min(request.after_id, MAX_ROW_ID), limit + 1)
        page: list[HeldMessage] = []
        size, scanned = 0, 0
        for h in rows[:limit]:
            # A message held for an agent the caller may not talk to is not theirs to read
            # (its text may be for the agent's named users alone): skipped, not ending the page.
            route = self._inbox.route(h.channel, h.where)
            if route is not None and not may_talk(route[0]):
                scanned += 1
                continue
            size += len(h.text.encode("utf-8", "surrogatepass")) + len(h.sender) + len(h.where)
            if page and size > HELD_PAGE_TEXT:
                break
            page.append(h)
            scanned += 1
        more = scanned < len(rows)
        return admin_pb2.ListHeldResponse(
            held=[held_to_proto(h) for h in page],
            next_after_id=rows[scanned - 1].id if more and scanned else 0,
        )

    async def AdmitHeld(
        self, request: admin_pb2.AdmitHeldRequest, context: Context
    ) -> admin_pb2.AdmitHeldResponse:
        held_id = _held_id(request.id)
        who = operator()
        # Under four-eyes, whoever let the message in may not approve what the session then
        # submits (services/gateway.py): counted before the session has it.
        # Admitting lets a stranger talk to the agent on the caller's word: only someone who
        # may talk to that agent may (checked once the route is known, before anything moves).
        receipt = await self._inbox.admit(
            held_id, sending=lambda sid: self._messages.note_sender(sid, who), check=require_talk
        )
        self._audit_trail.record(
            "channel.admitted", operator(), held=held_id, sid=receipt.sid, inbound_seq=receipt.seq,
            admission=receipt.admission.value,
        )  # fmt: skip
        return admin_pb2.AdmitHeldResponse(
            admission=receipt.admission.value, sid=receipt.sid, seq=receipt.seq
        )

    async def DropHeld(
        self, request: admin_pb2.DropHeldRequest, context: Context
    ) -> admin_pb2.DropHeldResponse:
        held_id = _held_id(request.id)
        held = self._inbox.drop_held(held_id)
        self._audit_trail.record(
            "channel.dropped", operator(), held=held_id, channel=held.channel,
            sender=f"{held.channel}:{held.sender}",
            event_id=sender_event_id(held.where, held.event_id),
        )  # fmt: skip
        return admin_pb2.DropHeldResponse()


def _name(name: str) -> str:
    if not name:
        raise InvalidArgument("name: expected a channel name (see: ironctl channel list)")
    return name


def _held_id(text: str) -> int:
    if not re.fullmatch(r"[1-9][0-9]{0,17}", text):
        raise InvalidArgument(
            f"id: expected a held message id (a number; see: ironctl channel held), got "
            f"{text[:40]!r}"
        )
    return int(text)


def channel_to_proto(report: ChannelReport) -> admin_pb2.Channel:
    s = report.status
    return admin_pb2.Channel(
        name=s.name,
        kind=s.kind,
        connected=s.connected,
        detail=s.detail,
        last_error=s.last_error,
        last_error_at=s.last_error_at,
        counters={k: max(v, 0) for k, v in s.counters.items()},
        deliveries={k: max(v, 0) for k, v in report.deliveries.items()},
        held=report.held,
        failures=[
            admin_pb2.ChannelDelivery(
                delivery_id=f"{d.sid}-{d.reply_seq}",
                state=d.state,
                attempts=d.attempts,
                last_error=d.last_error,
                updated_at=d.updated_at,
                next_at=d.next_at,
            )
            for d in report.failures
        ],
    )


HELD_PAGE = 200  # held messages in a page when the caller names no limit
HELD_PAGE_MAX = 500
HELD_PAGE_TEXT = 3 * 1024 * 1024  # a page ends before its text passes this
MAX_ROW_ID = 2**63 - 1  # SQLite's largest rowid: a larger after_id lists nothing


def held_to_proto(h: HeldMessage) -> admin_pb2.HeldMessage:
    return admin_pb2.HeldMessage(
        id=str(h.id), channel=h.channel, where=h.where, sender=f"{h.channel}:{h.sender}",
        event_id=sender_event_id(h.where, h.event_id), thread=h.thread, text=h.text,
        mentioned=h.mentioned,
        received_at=h.received_at,
    )  # fmt: skip
