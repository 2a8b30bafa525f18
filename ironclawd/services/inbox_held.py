"""``HeldMessages``: the messages an inbox (services/inbox.py) holds for an operator's decision
(``ironctl channel held``, ``admit``, ``drop``; docs/channels.md).

Two kinds are held: a stranger's message under ``unknown = "hold"``, and an allowed sender's
whose receive failed ``MAX_RECEIVE_TRIES`` times (its channel goes on with the others). Each
channel holds at most ``MAX_HELD_MESSAGES`` messages and ``MAX_HELD_BYTES`` of their texts, of
which strangers may fill all but a reserve kept for failing messages. A failing message past
every bound is dropped, counted and logged. Discarding a failing message, by the operator or the
cap, forgets the receive kept for it unless its session's queue has it already.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ironclawd import ratelog
from ironclawd.domain.message_ids import MessageId, message_id
from ironclawd.errors import ChannelFailed, Conflict, IronclawError
from ironclawd.ports import Clock
from ironclawd.ports.channel_records import ChannelRecords, HeldMessage
from ironclawd.ports.channels import Admission, InboundEvent, Receipt
from ironclawd.services.inbox_receive import Receives

log = logging.getLogger("ironclawd.inbox")

# Messages held for an operator's decision, per channel, and the UTF-8 bytes of their texts:
# strangers under `unknown = "hold"` each under the sender rate filled the state DB (600 a
# minute of 16 KiB), and `ironctl channel held` shows them all in one answer of at most 4 MiB.
MAX_HELD_MESSAGES = 1000
MAX_HELD_BYTES = 1024 * 1024
# Of those, strangers may fill all but a reserve kept for the failing messages of allowed
# senders: once strangers had filled the cap, such a message was tried again at every offer,
# each try a start of its session, and Matrix synced the same position for ever (a review).
HELD_RESERVE_MESSAGES = 100
HELD_RESERVE_BYTES = 256 * 1024
HELD_FULL = "too many messages wait for an operator's decision already; try again later"
HELD_FAILED = "held for an operator: it could not be queued"
FAILED_DROPPED = "it could not be queued, and too many messages wait for an operator already"


class HeldMessages:
    def __init__(
        self,
        records: ChannelRecords,
        receives: Receives,
        clock: Clock,
        count: Callable[[str, str], None],
    ) -> None:
        self._records = records
        self._receives = receives
        self._clock = clock
        self._count = count  # (channel, counter): shown by ``ironctl channel show``

    def hold_stranger(self, event: InboundEvent) -> Receipt:
        """Hold a message of a sender the permissions hold, unless strangers' share is full."""
        held = self._hold(event, failed=False)
        if held is None:
            self._count(event.channel, "held_full")
            ratelog.warning(log, event.channel, "held full",
                            "channel %s: dropped a message from %r: %d messages or %d bytes of "
                            "strangers are held for an operator already (ironctl channel held)",
                            event.channel, event.sender, MAX_HELD_MESSAGES - HELD_RESERVE_MESSAGES,
                            MAX_HELD_BYTES - HELD_RESERVE_BYTES)  # fmt: skip
            return Receipt(Admission.DROPPED, reason=HELD_FULL)
        log.info("channel %s: holding message %d from %r", event.channel, held.id,
                 event.sender)  # fmt: skip
        return Receipt(Admission.HELD, reason="held for an operator to admit")

    def hold_failed(self, event: InboundEvent, tries: int, exc: IronclawError | None) -> Receipt:
        """Hold a message whose receive failed ``tries`` times with ``exc`` (None: offered
        again after that, and not tried again): its channel goes on with the others, and an
        operator can try it again (``ironctl channel admit``) or drop it. Past the cap it is
        dropped, rather than tried again at every offer or left to hold up its room."""
        held = self._hold(event, failed=True)
        if held is None:
            return self._drop_failed(event, tries, exc)
        if exc is not None:
            self._count(event.channel, "receive_failed_held")
            log.error(
                "channel %s: event %s of %r in %s: receiving it failed %d times (%s); held as "
                "%d for an operator (ironctl channel admit %d tries it again)",
                event.channel, event.event_id, event.sender, event.where, tries, exc, held.id,
                held.id, extra=message_id(MessageId.CHANNEL_MESSAGE_FAILED,
                                          IRONCLAW_CHANNEL=event.channel),
            )  # fmt: skip
        return Receipt(Admission.HELD, reason=HELD_FAILED)

    def _drop_failed(self, event: InboundEvent, tries: int, exc: IronclawError | None) -> Receipt:
        where = f"channel {event.channel}: event {event.event_id}"
        queued = self._forget_receive(event.channel, event.event_id, where)
        if queued is not None:  # its queue took it: only its record failed
            return Receipt(Admission.DUPLICATE, queued[1], queued[0])
        self._count(event.channel, "receive_failed_dropped")
        log.error(
            "%s of %r in %s: receiving it failed %d times%s, and %d messages or %d bytes are "
            "held for an operator already (ironctl channel held); dropped",
            where, event.sender, event.where, tries, f" ({exc})" if exc else "",
            MAX_HELD_MESSAGES, MAX_HELD_BYTES,
            extra=message_id(MessageId.CHANNEL_MESSAGE_FAILED, IRONCLAW_CHANNEL=event.channel),
        )  # fmt: skip
        return Receipt(Admission.DROPPED, reason=FAILED_DROPPED)

    def _hold(self, event: InboundEvent, *, failed: bool) -> HeldMessage | None:
        """Hold ``event`` (once); None if its channel holds all it may: a stranger's message
        may not use the reserve of those whose receive ``failed``."""
        rows, size = MAX_HELD_MESSAGES, MAX_HELD_BYTES
        if not failed:
            rows, size = rows - HELD_RESERVE_MESSAGES, size - HELD_RESERVE_BYTES
        held = HeldMessage(
            0, event.channel, event.where, event.sender, event.event_id, event.thread,
            event.text, event.mentioned, event.received_at or self._clock.time(),
        )  # fmt: skip
        return self._records.hold(held, rows, size)

    def drop(self, held_id: int) -> HeldMessage:
        """Discard a held message, and the receive kept for it if its send failed (else the
        next start or a reply of its session queued it after all: found by a review). Conflict
        if it reached its session already (once what failed worked again): nothing is dropped
        then, and ``admit`` clears it."""
        h = self._records.get_held(held_id)
        queued = self._forget_receive(h.channel, h.event_id, f"held message {held_id}")
        if queued is not None:
            sid, seq = queued
            raise Conflict(
                f"held message {held_id}: it is in the queue of session {sid} already (message "
                f"{seq}), so it cannot be dropped; ironctl channel admit {held_id} clears it "
                f"from the list"
            )
        self._records.delete_held(held_id)
        return h

    def _forget_receive(self, channel: str, event_id: str, what: str) -> tuple[str, int] | None:
        """Forget the receive kept for an event being discarded, so that neither
        ``Receives.resume`` nor ``Receives.finish`` queues it later. If its session's queue
        has the message already (recorded, or taken by a send whose record then raised),
        nothing is forgotten, so that replies to it still go back to its sender: (sid, seq)
        of it then. ChannelFailed while a receive of this daemon is queueing it (whether its
        queue will have it is not known yet)."""
        if self._receives.working_on(channel, event_id):
            raise ChannelFailed(f"{what}: it is being queued right now; try again")
        done = self._records.message_by_event(channel, event_id)
        if done is not None:
            return done.sid, done.seq
        queued = self._receives.queued_unrecorded(channel, event_id)
        if queued is None:
            self._records.forget_receive(channel, event_id)
        return queued
