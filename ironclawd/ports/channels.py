"""The port between the channels people talk on (Matrix, signed webhooks) and the inbox.

An adapter (``host/matrix.py``, ``host/webhook.py``) turns what its channel's server asserts into
``InboundEvent`` values and hands each to the ``InboxSink`` (``services/inbox.py``); it
acknowledges the message to its channel only after ``receive`` returned, which is after the
message is durably in a session's inbound queue, held, or refused. Replies go back through the
adapter's ``deliver``, keyed by a stable ``delivery_id`` the channel de-duplicates on. Nothing
else of a channel crosses: no credential, no raw HTTP, no client object (docs/channels.md).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class InboundEvent:
    """One message as its channel's server asserted it. Everything here is hostile input."""

    channel: str  # the [[channels]] name it came in on
    event_id: str  # the channel's own id for it (Matrix event id, webhook body's event_id)
    sender: str  # the raw identity on that channel ("@alice:server", a webhook endpoint name)
    where: str  # Matrix room id or webhook endpoint name: what wiring routes on
    text: str  # the plain text body, never a formatted one
    thread: str = ""  # thread root event id (Matrix) or the body's thread ("" for none)
    mentioned: bool = False  # the bot was mentioned (Matrix); webhooks: always False
    received_at: float = 0.0  # wall-clock seconds when the adapter took it


class Admission(enum.Enum):
    """What the inbox did with an event; adapters map it to their channel's answer."""

    QUEUED = "queued"  # now durably in a session's inbound queue
    DUPLICATE = "duplicate"  # this (channel, event id) was queued before: nothing new
    HELD = "held"  # unknown sender under `hold`: kept for an operator to admit or drop
    DROPPED = "dropped"  # the sender may not talk to the agent this is wired to
    NOT_WIRED = "not_wired"  # no agent is wired to this room or endpoint
    NOT_ENGAGED = "not_engaged"  # wired, but the route's engage rule did not fire
    REFUSED = "refused"  # the message itself is unacceptable (size, characters): see reason


@dataclass(frozen=True)
class Receipt:
    admission: Admission
    seq: int = 0  # the inbound seq for QUEUED and DUPLICATE
    sid: str = ""  # the session it went to
    reason: str = ""  # why, for DROPPED, NOT_WIRED, REFUSED (safe to show the sender)


class InboxSink(Protocol):
    """What adapters hand events to (implemented by ``services/inbox.py``)."""

    async def receive(self, event: InboundEvent) -> Receipt:
        """Route, admit and queue one event; returns only once the outcome is durable. Raises
        an ``IronclawError`` when it could not decide (the adapter must not acknowledge)."""
        ...

    def wired(self, channel: str) -> frozenset[str]:
        """The rooms or endpoints of ``channel`` some agent is wired to now."""
        ...

    def screen(self, channel: str, where: str, sender: str) -> Admission | None:
        """Before an adapter spends its rate meters on a sender's event: NOT_WIRED or DROPPED
        if ``receive`` would refuse it for where it came from or who sent it (strangers must
        not use up the rate of the senders an agent admits); None if it may go on."""
        ...

    async def cursor(self, channel: str) -> str | None:
        """The channel's saved position (a Matrix sync token), None before the first save."""
        ...

    async def save_cursor(self, channel: str, cursor: str) -> None:
        """Durably store the position: every event before it was received."""
        ...


@dataclass(frozen=True)
class OutboundReply:
    """One reply of an agent to a message that came in on a channel."""

    delivery_id: str  # f"{sid}-{reply_seq}": stable across restarts; the channel de-duplicates
    channel: str
    where: str  # the room or endpoint the message came from
    thread: str  # the thread it came in ("" none)
    in_reply_to_event: str  # the channel's event id of the message answered
    text: str
    reply_url: str = ""  # webhook routes: where to POST ("" = the route delivers nowhere)


@dataclass(frozen=True)
class ChannelStatus:
    name: str
    kind: str  # "matrix" | "webhook"
    connected: bool  # Matrix: the last sync succeeded; webhook: the listener is bound
    detail: str = ""  # where: the homeserver and user, the listen address
    last_error: str = ""
    last_error_at: float = 0.0
    counters: Mapping[str, int] = field(default_factory=dict)  # received, refused, delivered…


class ChannelAdapter(Protocol):
    """One configured channel. Errors: ``ChannelFailed`` (``retryable`` says whether a later
    attempt may succeed) or ``InvalidArgument``. Never blocks the event loop."""

    name: str
    kind: str

    async def start(self, sink: InboxSink) -> None:
        """Begin receiving in the background (returns once listening or first connecting)."""
        ...

    async def stop(self) -> None:
        """Stop receiving; events being handed over finish first. Idempotent."""
        ...

    async def deliver(self, reply: OutboundReply) -> None:
        """Return once the channel accepted the reply; delivering the same ``delivery_id``
        twice must not show it twice."""
        ...

    def status(self) -> ChannelStatus: ...

    async def test(self) -> str:
        """Check the channel end to end without sending a message (log in, bind, resolve);
        a description of what was checked, or ``ChannelFailed``."""
        ...


class WebhookSender(Protocol):
    """Outbound HTTP for the webhook channel under the egress broker's address rules
    (implemented by ``services/webhook_delivery.py``; ``host/webhook.py`` may not reach the
    network layer itself)."""

    async def post(
        self, *, channel: str, url: str, body: bytes, secret: bytes, delivery_id: str
    ) -> int:
        """Sign ``body`` with ``secret`` (``formats/webhook_sig.py``) and POST it to ``url`` with
        ``X-Ironclaw-Delivery-Id: delivery_id``: the name resolved once on the host, every answer
        checked like the broker's, the connection made only to the checked address. Returns the
        2xx status once the receiver accepted it; else ``ChannelFailed`` (``retryable`` False
        for a refused URL or address and for a 3xx or a 4xx other than 408 and 429)."""
        ...
