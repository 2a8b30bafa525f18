"""``Receives``: the last step of a channel message's receive (services/inbox.py).

Receiving is a redo log (ports/channel_records.py): the inbox keeps a ``Receiving`` row, then
this hands it to its session's queue (which de-duplicates its client id) and records the
``ChannelMessage`` in place of the row. A row whose send or record raised stays; it is finished
when its channel offers the message again, when a reply of its session needs to know which
message it answers (``finish``, the deliverer's ``finish_receives``), or at the next start
(``resume``). Only a receive being worked on in this daemon is ever waited for.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter

from ironclawd.errors import ChannelFailed, IronclawError, NotFound
from ironclawd.ports.channel_records import ChannelMessage, ChannelRecords, Receiving
from ironclawd.ports.channels import Admission, Receipt
from ironclawd.services.inbox_delivery import Deliverer, MessagePort, Sent

log = logging.getLogger("ironclawd.inbox")

MAX_UNRECORDED = 1024  # receives remembered whose message was queued but not recorded


class Receives:
    def __init__(
        self, records: ChannelRecords, messages: MessagePort, deliverer: Deliverer
    ) -> None:
        self._records = records
        self._messages = messages
        self._deliverer = deliverer
        # (channel, event id) of the receives between sending and recording, by how many.
        self._in_flight: Counter[tuple[str, str]] = Counter()
        # (channel, event id) -> (sid, seq): receives whose message the queue took but whose
        # record then raised, so that discarding one does not forget it (``queued_unrecorded``).
        self._unrecorded: dict[tuple[str, str], tuple[str, int]] = {}

    async def complete(self, r: Receiving) -> Receipt:
        """Queue a kept receive and record its message; ChannelFailed if its session was
        removed meanwhile (the row is forgotten: the message is routed again next time)."""
        try:
            return await self._send(r)
        except NotFound as exc:
            raise ChannelFailed(f"channel {r.channel}: {exc}; try again") from exc

    async def _send(self, r: Receiving) -> Receipt:
        key = (r.channel, r.event_id)
        self._in_flight[key] += 1
        sent: Sent | None = None
        try:
            try:
                sent = await self._messages.send(r.sid, r.text, r.client_id)
                self._records.complete_receive(
                    ChannelMessage(
                        r.sid, sent.seq, r.channel, r.where, r.thread, r.event_id, r.sender,
                        r.reply_url,
                    )
                )  # fmt: skip
            except NotFound:
                self._records.forget_receive(r.channel, r.event_id)
                self._unrecorded.pop(key, None)
                raise
            except IronclawError:
                if sent is not None:
                    self._remember_unrecorded(key, (r.sid, sent.seq))
                # The queue may have taken it: a reply to it is delivered once its receive is
                # finished (``finish``), without waiting for the session's next message.
                self._deliverer.follow(r.sid)
                raise
        finally:
            self._in_flight[key] -= 1
            if not self._in_flight[key]:
                del self._in_flight[key]
        self._unrecorded.pop(key, None)
        self._deliverer.received(r.sid)
        return Receipt(Admission.QUEUED if sent.new else Admission.DUPLICATE, sent.seq, r.sid)

    def _remember_unrecorded(self, key: tuple[str, str], queued: tuple[str, int]) -> None:
        self._unrecorded.pop(key, None)
        if len(self._unrecorded) >= MAX_UNRECORDED:
            del self._unrecorded[next(iter(self._unrecorded))]  # the oldest
        self._unrecorded[key] = queued

    def working_on(self, channel: str, event_id: str) -> bool:
        """Whether a receive of this daemon is sending or recording the event right now."""
        return (channel, event_id) in self._in_flight

    def queued_unrecorded(self, channel: str, event_id: str) -> tuple[str, int] | None:
        """(sid, seq) of the event's message if a send of this daemon's put it in its queue
        and its record then raised (its receive row stays until ``finish`` or ``resume``
        records it); None if no send did, or none since the daemon started."""
        return self._unrecorded.get((channel, event_id))

    async def finish(self, sid: str) -> bool:
        """Finish ``sid``'s receives that no receive of this daemon is working on: one whose
        send or record raised leaves its row, and its channel may never offer the event again
        (the sender gave up; the event was held). The message is queued once, as a restart
        would. Whether a receive of ``sid`` is still being worked on; an error of a send or
        record is raised."""
        for r in self._records.receiving():
            if r.sid == sid and (r.channel, r.event_id) not in self._in_flight:
                with contextlib.suppress(NotFound):  # the session is gone: nothing to finish
                    await self._send(r)
        return any(
            r.sid == sid and (r.channel, r.event_id) in self._in_flight
            for r in self._records.receiving()
        )

    async def resume(self) -> None:
        """After a restart: finish the receives a dead daemon left."""
        for r in self._records.receiving():
            if (r.channel, r.event_id) in self._in_flight:
                continue  # a receive of the channel's is finishing it
            try:
                await self.complete(r)
            except IronclawError as exc:
                log.warning("channel %s: finishing a receive for session %s: %s", r.channel,
                            r.sid, exc)  # fmt: skip
