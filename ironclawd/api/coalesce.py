"""Streams to a sandbox with fewer, larger messages when the sandbox reads slower than the source
produces (issue 17). Each message a sandbox reads costs it syscalls, and under gVisor's ptrace
platform each syscall is a round trip through the sentry: a 4 MiB download sent as one gRPC
message per TLS record, or a reply as one message per word, spent the box's time on framing.

``coalesced`` reads the source in a task of its own into a bounded buffer. Each item it yields
joins every joinable item already buffered at that moment, up to ``max_size``. Nothing waits to
fill a message: when the sandbox keeps up, every item goes out as it came, so a trickle of
server-sent events or tokens is never held back. Order is kept, non-joinable items (a head, an
end, a tool call) pass alone, a source's exception reaches the consumer after what preceded it,
and when the consumer goes away the source is closed (its audit and upstream close run).

``settle`` (the egress broker's bodies): a source that is still producing is given a few more
turns of the event loop before each message goes out, so that what it produces back to back
joins. Measured with the egress bench (issue 17): a 4 MiB body over TLS comes as 16 KiB
records, one every ~3 turns of the loop; without settling, nearly every record went out as a
message of its own (37-247 messages a body), and the time grew with their number. The wait
ends at the first ``settle`` turns in a row that add nothing, at ``max_size``, after a bounded
number of turns, or when the source ends: no timer, and a trickle waits only those idle turns
(microseconds), never for more data."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

T = TypeVar("T")


@dataclass(frozen=True)
class Joining(Generic[T]):
    """How items of one stream join: ``size`` of a joinable item (None: it passes alone),
    ``join`` of consecutive joinable items, and ``split(item, n)`` into its first ``n`` units and
    the rest (None: never split; an item larger than the limit passes whole)."""

    size: Callable[[T], int | None]
    join: Callable[[list[T]], T]
    split: Callable[[T, int], tuple[T, T]] | None = None


class _End:
    pass


class _Failed:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc


class Buffer(Generic[T]):
    """Items in order, with the joinable units waiting bounded by ``limit``: the reader waits
    while that many are unsent (backpressure then reaches the source as before)."""

    def __init__(self, joining: Joining[T], limit: int) -> None:
        self._joining = joining
        self._items: list[T | _End | _Failed] = []
        self._units = 0
        self._limit = limit
        self._changed = asyncio.Condition()

    async def put(self, item: T | _End | _Failed) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._units < self._limit)
            self._items.append(item)
            self._units += self._size(item) or 0
            self._changed.notify_all()

    def _size(self, item: T | _End | _Failed) -> int | None:
        if isinstance(item, (_End, _Failed)):
            return None
        return self._joining.size(item)

    async def settle(self, max_size: int, quiet: int, most: int) -> None:
        """Once an item is here, yield to the loop while the source keeps adding joinable
        units: until ``quiet`` turns in a row add nothing, ``max_size`` units wait, ``most``
        turns passed, or the last item cannot join (a head, the end, an error)."""
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._items))
        idle = turns = 0
        while idle < quiet and turns < most and self._units < max_size:
            if self._size(self._items[-1]) is None:
                return
            before = self._units
            await asyncio.sleep(0)
            turns += 1
            idle = 0 if self._units != before else idle + 1

    async def take(self, max_size: int) -> T | _End | _Failed:
        """The next item; consecutive joinable items already buffered come joined (up to
        ``max_size`` units, a larger one split where the stream allows it)."""
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._items))
            first = self._items[0]
            if self._size(first) is None:
                self._items.pop(0)
                return first
            parts: list[T] = []
            taken = 0
            while self._items and (size := self._size(self._items[0])) is not None:
                item, room = cast(T, self._items[0]), max_size - taken
                if size <= room:  # joins whole
                    parts.append(item)
                    self._items.pop(0)
                    taken += size
                    continue
                if self._joining.split is not None and room > 0:  # its head fills the message
                    head, self._items[0] = self._joining.split(item, room)
                    parts.append(head)
                    taken += room
                elif not parts:  # cannot be split: a larger item passes whole, alone
                    parts.append(item)
                    self._items.pop(0)
                    taken += size
                break
            self._units -= taken
            self._changed.notify_all()
            return parts[0] if len(parts) == 1 else self._joining.join(parts)


async def coalesced(
    source: AsyncIterator[T],
    joining: Joining[T],
    *,
    max_size: int,
    read_ahead: int,
    settle: int = 0,
    settle_most: int = 64,
) -> AsyncGenerator[T, None]:
    """``source``'s items, joined where the consumer is slower, and with ``settle`` where the
    source produces back to back (see the module's docstring)."""
    buffer: Buffer[T] = Buffer(joining, read_ahead)

    async def read() -> None:
        try:
            async for item in source:
                await buffer.put(item)
        except Exception as exc:  # handed to the consumer, raised there
            await buffer.put(_Failed(exc))
            return
        await buffer.put(_End())

    reader = asyncio.create_task(read())
    try:
        while True:
            if settle:
                await buffer.settle(max_size, settle, settle_most)
            item = await buffer.take(max_size)
            if isinstance(item, _End):
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        close = getattr(source, "aclose", None)
        if close is not None:
            await close()
