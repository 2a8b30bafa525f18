"""api/coalesce.py on its own: items that cannot be split join only while they fit and an
oversized one passes whole; non-joinable items pass alone and in order; a source's error
arrives after what preceded it; a consumer that stops early closes the source."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from ironclawd.api.coalesce import Buffer, Joining, coalesced

WORDS = Joining[str](size=lambda s: len(s) if s.islower() else None, join="".join)


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_unsplittable_items_join_while_they_fit() -> None:
    async def main() -> list[object]:
        buffer = Buffer(WORDS, limit=1000)
        for item in ("ab", "cd", "efg", "HEAD", "hijklmnop", "q"):
            await buffer.put(item)
        return [await buffer.take(5) for _ in range(5)]

    assert _run(main()) == ["abcd", "efg", "HEAD", "hijklmnop", "q"]


def test_splittable_items_fill_each_message_and_the_rest_follows() -> None:
    split = Joining[str](WORDS.size, "".join, lambda s, n: (s[:n], s[n:]))

    async def main() -> list[object]:
        buffer = Buffer(split, limit=1000)
        for item in ("ab", "cdefgh", "ij", "K", "lmnopqrstuv"):
            await buffer.put(item)
        return [await buffer.take(5) for _ in range(6)]

    assert _run(main()) == ["abcde", "fghij", "K", "lmnop", "qrstu", "v"]


def test_the_stream_keeps_its_order_and_joins_only_what_waits() -> None:
    async def source() -> AsyncGenerator[str, None]:
        for item in ("START", "a", "b", "c", "MIDDLE", "d", "END"):
            yield item

    async def main() -> list[str]:
        got = []
        async for item in coalesced(source(), WORDS, max_size=100, read_ahead=100):
            got.append(item)
            await asyncio.sleep(0.01)  # a slow consumer: what arrives meanwhile joins
        return got

    got = _run(main())
    assert "".join(got) == "STARTabcMIDDLEdEND"
    assert [g for g in got if not g.islower()] == ["START", "MIDDLE", "END"]
    assert len(got) < 7


def test_an_error_arrives_after_what_preceded_it() -> None:
    async def source() -> AsyncGenerator[str, None]:
        yield "HEAD"
        yield "body"
        raise ValueError("upstream broke")

    got: list[str] = []

    async def drain() -> None:
        async for item in coalesced(source(), WORDS, max_size=100, read_ahead=100):
            got.append(item)

    async def main() -> list[str]:
        with pytest.raises(ValueError, match="upstream broke"):
            await drain()
        return got

    assert _run(main()) == ["HEAD", "body"]


def test_a_consumer_that_stops_closes_the_source() -> None:
    closed = asyncio.Event()

    async def source() -> AsyncGenerator[str, None]:
        try:
            while True:
                yield "x"
                await asyncio.sleep(0)
        finally:
            closed.set()

    async def main() -> None:
        relay = coalesced(source(), WORDS, max_size=4, read_ahead=8)
        async for _item in relay:
            break
        await relay.aclose()
        await asyncio.wait_for(closed.wait(), 2)

    _run(main())
    assert closed.is_set()


def test_settling_joins_what_a_busy_source_produces_back_to_back() -> None:
    """A source that has its next item after a turn or two of the loop (a TLS body whose
    records are already in the socket): without settling, a consumer as fast as it sends each
    item alone; with it, they go out joined, in order, up to max_size."""

    async def busy() -> AsyncGenerator[str, None]:
        for i in range(40):
            for _ in range(i % 3):  # the next record takes 0-2 turns
                await asyncio.sleep(0)
            yield "abcdefghij"[i % 10]

    async def main(settle: int) -> list[str]:
        return [i async for i in coalesced(busy(), WORDS, max_size=16, read_ahead=64,
                                           settle=settle)]  # fmt: skip

    alone, settled = _run(main(0)), _run(main(8))
    assert "".join(alone) == "".join(settled) == "abcdefghij" * 4
    assert len(alone) >= 20
    assert len(settled) == 3  # 16 + 16 + 8
    assert max(len(s) for s in settled) <= 16


def test_settling_never_holds_a_trickle_back() -> None:
    """A source that waits between items (tokens, server-sent events): each goes out alone,
    soon after it was produced and before the next is, and a non-joinable item ends the
    settling at once. (Times relative to each item's production: a loaded machine stretches
    the source's sleeps, not the settling.)"""
    produced: dict[str, float] = {}
    sent: list[tuple[str, float]] = []

    async def trickle() -> AsyncGenerator[str, None]:
        for item in ("a", "b", "HEAD", "c"):
            produced[item] = asyncio.get_running_loop().time()
            yield item
            await asyncio.sleep(0.1)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async for item in coalesced(trickle(), WORDS, max_size=100, read_ahead=100, settle=8):
            sent.append((item, loop.time()))

    _run(main())
    assert [item for item, _ in sent] == ["a", "b", "HEAD", "c"]
    for (item, at), later in zip(sent, ["b", "HEAD", "c", None], strict=True):
        assert at - produced[item] < 0.05  # settling is a few idle turns, not a wait
        if later is not None:
            assert at < produced[later]  # out before the next one was produced
