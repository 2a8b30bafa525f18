"""What the inbox (services/inbox.py) keeps durably about channels (real: store/channel_state.py
in the state DB; fake: tests/fakes/channels.py). Nothing here names SQL or a file.

Receiving is a small redo log: a ``Receiving`` row is written before the message is sent to the
session's queue and replaced by a ``ChannelMessage`` once the queue gave its seq, so a daemon
killed in between finishes the send on start (the queue's client-id de-duplication makes that
send idempotent) and no reply to it is ever taken for an operator's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# A delivery's states: ``pending`` until the channel accepted it (then ``delivered``), ``failed``
# when the channel refused it for good, ``skipped`` when the reply answered no channel message
# (an operator's ``ironctl send``) or its route delivers nowhere.
DELIVERY_STATES = ("pending", "delivered", "failed", "skipped")


@dataclass(frozen=True)
class Receiving:
    """An inbound message routed to a session, not yet known to be in its queue."""

    channel: str
    event_id: str
    sid: str
    client_id: str
    where: str
    thread: str
    sender: str
    text: str
    reply_url: str = ""


@dataclass(frozen=True)
class ChannelMessage:
    """An inbound message in a session's queue at ``seq``: where its replies go."""

    sid: str
    seq: int
    channel: str
    where: str
    thread: str
    event_id: str
    sender: str
    reply_url: str = ""


@dataclass(frozen=True)
class HeldMessage:
    """A message from a sender the permissions hold for an operator (id 0 before it is kept)."""

    id: int
    channel: str
    where: str
    sender: str
    event_id: str
    thread: str
    text: str
    mentioned: bool
    received_at: float


@dataclass(frozen=True)
class Delivery:
    sid: str
    reply_seq: int
    channel: str
    state: str  # DELIVERY_STATES
    attempts: int = 0
    next_at: float = 0.0
    last_error: str = ""
    updated_at: float = 0.0


class ChannelRecords(Protocol):
    def cursor(self, channel: str) -> str | None: ...
    def save_cursor(self, channel: str, cursor: str) -> None: ...

    def channel_session(self, channel: str, where: str, key: str) -> str | None: ...
    def set_channel_session(self, channel: str, where: str, key: str, sid: str) -> None: ...
    def channel_sessions(self, channel: str, where: str) -> list[str]:
        """The sessions recorded for (channel, where), one per key."""
        ...

    def begin_receive(self, receiving: Receiving) -> Receiving:
        """Keep it unless one for (channel, event_id) is kept already; return the kept one."""
        ...

    def receiving(self) -> list[Receiving]:
        """Every receive not completed, oldest first."""
        ...

    def has_receiving(self, sid: str) -> bool: ...

    def complete_receive(self, message: ChannelMessage) -> None:
        """Keep the message (once) and forget its ``Receiving``, in one transaction."""
        ...

    def forget_receive(self, channel: str, event_id: str) -> None:
        """Forget a receive whose session went away before its message was queued."""
        ...

    def message(self, sid: str, seq: int) -> ChannelMessage | None: ...
    def message_by_event(self, channel: str, event_id: str) -> ChannelMessage | None: ...
    def channel_sids(self) -> list[str]:
        """Sessions that have channel messages (their replies are followed)."""
        ...

    def hold(self, held: HeldMessage, max_rows: int, max_bytes: int) -> HeldMessage | None:
        """Keep it unless (channel, event_id) is held already; return the kept one. None, and
        nothing kept, if its channel holds ``max_rows`` messages already or their texts and
        this one's would pass ``max_bytes`` (UTF-8)."""
        ...

    def held(self, after: int = 0, limit: int = -1) -> list[HeldMessage]:
        """Held messages with id > ``after``, by id, at most ``limit`` (-1: all)."""
        ...

    def held_count(self, channel: str) -> int: ...
    def get_held(self, held_id: int) -> HeldMessage:
        """NotFound if there is none."""
        ...

    def delete_held(self, held_id: int) -> None: ...

    def add_delivery(self, delivery: Delivery) -> Delivery:
        """Keep it unless (sid, reply_seq) is kept already; return the kept one."""
        ...

    def save_delivery(self, delivery: Delivery) -> None: ...
    def last_settled(self, sid: str) -> int:
        """The highest reply seq of ``sid`` with a delivery row (0 for none)."""
        ...

    def pending_deliveries(self, sid: str) -> list[Delivery]: ...
    def delivery_counts(self, channel: str) -> dict[str, int]:
        """Deliveries of the channel by state."""
        ...

    def failed_deliveries(self, channel: str, limit: int) -> list[Delivery]:
        """The newest failed or retrying (pending with an error) deliveries."""
        ...
