"""``Deliverer``: replies to channel messages go back out through their channel's adapter.

One task per session that has channel messages follows its replies in order
(``MessageService.watch``) from the last one settled. Each reply answering a channel message
gets a ``pending`` delivery row first, then the adapter's ``deliver`` with ``delivery_id =
f"{sid}-{reply_seq}"``, and is marked ``delivered`` only after that returned: a daemon killed in
between delivers again with the same id, which the channel de-duplicates (Matrix: transaction
id; webhooks: ``X-Ironclaw-Delivery-Id``). A retryable failure backs off (1 s doubling to 5 min,
kept across restarts in ``next_at``) and holds the session's later replies behind it, in order;
one that cannot succeed is ``failed`` with its error (``ironctl channel show``). A failure of the
bookkeeping itself (the state DB full or failing) backs off the same way and follows again from
the first reply not settled: only the session's removal ends its task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Protocol

from ironclawd.domain.messages import Reply
from ironclawd.errors import ChannelFailed, InvalidArgument, IronclawError, NotFound
from ironclawd.ports import Clock
from ironclawd.ports.channel_records import ChannelMessage, ChannelRecords, Delivery
from ironclawd.ports.channels import ChannelAdapter, OutboundReply

log = logging.getLogger("ironclawd.inbox")

BACKOFF_INITIAL = 1.0
BACKOFF_MAX = 300.0
# The longest a reply waits for a receive of this daemon to record the message it may answer
# (the agent can answer before the receive that queued the message recorded it); past it the
# reply is taken for an answer to an operator's message.
RECEIVE_WAIT = 30.0


class Sent(Protocol):
    @property
    def seq(self) -> int: ...
    @property
    def new(self) -> bool: ...


class MessagePort(Protocol):
    """What the inbox needs of ``MessageService``."""

    async def send(self, sid: str, body: str, client_id: str = "") -> Sent: ...
    def watch(self, sid: str, after: int, follow: bool) -> AsyncIterator[Reply]: ...


class Deliverer:
    def __init__(
        self,
        *,
        records: ChannelRecords,
        messages: MessagePort,
        adapters: Mapping[str, ChannelAdapter],
        clock: Clock,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        backoff: tuple[float, float] = (BACKOFF_INITIAL, BACKOFF_MAX),
    ) -> None:
        self._records = records
        self._messages = messages
        self._adapters = adapters
        self._clock = clock
        self._sleep = sleep
        self._backoff = backoff
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._received = asyncio.Condition()
        self._settled = asyncio.Condition()
        # Finishes ``sid``'s receives that no receive of this daemon is working on and says
        # whether one still is (the inbox's ``finish_receives``). Alone, every receive is taken
        # for one being worked on.
        self.finish_receives: Callable[[str], Awaitable[bool]] = self._records_in_flight

    def follow(self, sid: str) -> None:
        """Make sure a task follows ``sid``'s replies (one that died of an error restarts)."""
        task = self._tasks.get(sid)
        if task is None or task.done():
            self._tasks[sid] = asyncio.get_running_loop().create_task(
                self._run(sid), name=f"deliver-{sid}"
            )

    def received(self, sid: str) -> None:
        """A receive for ``sid`` completed: its task may be waiting to know what a reply
        answered."""
        self.follow(sid)
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._received:
            self._received.notify_all()

    def forget(self, sid: str) -> None:
        """The session is being removed: stop following it."""
        task = self._tasks.pop(sid, None)
        if task is not None:
            task.cancel()

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def idle(self, sid: str, reply_seq: int) -> None:
        """Tests and benchmarks: wait until ``sid``'s reply ``reply_seq`` is settled."""
        async with self._settled:
            await self._settled.wait_for(
                lambda: (
                    self._records.last_settled(sid) >= reply_seq
                    and all(d.reply_seq > reply_seq for d in self._records.pending_deliveries(sid))
                )
            )

    async def _run(self, sid: str) -> None:
        first, most = self._backoff
        failures = 0
        while True:
            try:
                # From the first reply not settled: a pending delivery's, or the next one.
                pending = self._records.pending_deliveries(sid)
                after = pending[0].reply_seq - 1 if pending else self._records.last_settled(sid)
                async for reply in self._messages.watch(sid, after, True):
                    await self._settle(sid, reply)
                    failures = 0
                    async with self._settled:
                        self._settled.notify_all()
            except NotFound:
                log.info("session %s: gone; its replies are no longer delivered", sid)
                return
            except IronclawError as exc:
                # The bookkeeping failed (the state DB full, an I/O error): nothing else would
                # follow the session again until its next channel message or a restart, and
                # replies already taken in would wait that long (found by a review).
                failures += 1
                delay = min(first * 2 ** min(failures - 1, 30), most)
                log.error("session %s: following replies: %s; again in %gs", sid, exc, delay)
                await self._sleep(delay)
            else:
                return

    async def _settle(self, sid: str, reply: Reply) -> None:
        message = await self._answered(sid, reply.in_reply_to)
        adapter = self._adapters.get(message.channel) if message else None
        if message is None or (adapter is not None and adapter.kind == "webhook"
                               and not message.reply_url):  # fmt: skip
            # An operator's message (ironctl send), or a route that delivers nowhere.
            self._records.add_delivery(Delivery(sid, reply.seq, "", "skipped"))
            return
        delivery = self._records.add_delivery(
            Delivery(sid, reply.seq, message.channel, "pending", updated_at=self._clock.time())
        )
        if delivery.state == "pending":
            await self._attempt(delivery, message, reply.body)

    async def _answered(self, sid: str, seq: int) -> ChannelMessage | None:
        """The channel message at ``seq`` of ``sid``'s queue; None for any other (an
        operator's). A receive of the session's that failed (its send or its record raised)
        left a row that only a restart finished, and every reply of the session waited on it
        for ever (found by a review): such receives are finished now, and only one being worked
        on is waited for, at most ``RECEIVE_WAIT``."""
        message = self._records.message(sid, seq)
        deadline = asyncio.get_running_loop().time() + RECEIVE_WAIT
        while message is None and self._records.has_receiving(sid):
            working = await self.finish_receives(sid)
            message = self._records.message(sid, seq)
            if message is not None or not working:
                break
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                log.warning("session %s: reply to message %d: a receive of the session has not "
                            "recorded its message after %gs; taken for an operator's", sid, seq,
                            RECEIVE_WAIT)  # fmt: skip
                break
            # The receive that queued what this answers has not recorded it yet.
            async with self._received:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._received.wait(), min(1.0, left))
            message = self._records.message(sid, seq)
        return message

    async def _records_in_flight(self, sid: str) -> bool:
        return self._records.has_receiving(sid)

    async def _attempt(self, delivery: Delivery, message: ChannelMessage, text: str) -> None:
        out = OutboundReply(
            f"{delivery.sid}-{delivery.reply_seq}", message.channel, message.where,
            message.thread, message.event_id, text, message.reply_url,
        )  # fmt: skip
        while True:
            wait = delivery.next_at - self._clock.time()
            if wait > 0:
                await self._sleep(wait)
            try:
                await self._deliver(out)
            except (ChannelFailed, InvalidArgument) as exc:
                retry = isinstance(exc, ChannelFailed) and exc.retryable
                delivery = self._failed(delivery, str(exc), retry)
                if not retry:
                    return
                continue
            except IronclawError as exc:
                delivery = self._failed(delivery, str(exc), True)
                continue
            self._records.save_delivery(
                replace(
                    delivery,
                    state="delivered",
                    attempts=delivery.attempts + 1,
                    updated_at=self._clock.time(),
                )
            )
            return

    async def _deliver(self, out: OutboundReply) -> None:
        adapter = self._adapters.get(out.channel)
        if adapter is None:
            raise ChannelFailed(
                f"channel {out.channel} is not configured any more", retryable=False
            )
        await adapter.deliver(out)

    def _failed(self, delivery: Delivery, error: str, retry: bool) -> Delivery:
        attempts = delivery.attempts + 1
        first, most = self._backoff
        delay = min(first * 2 ** min(attempts - 1, 30), most)
        now = self._clock.time()
        updated = replace(
            delivery, state="pending" if retry else "failed", attempts=attempts,
            next_at=now + delay if retry else 0.0, last_error=error[:500], updated_at=now,
        )  # fmt: skip
        log.warning("delivery %s-%d (channel %s), attempt %d: %s%s", delivery.sid,
                    delivery.reply_seq, delivery.channel, attempts, error,
                    f"; again in {delay:g}s" if retry else "; giving up")  # fmt: skip
        self._records.save_delivery(updated)
        return updated
