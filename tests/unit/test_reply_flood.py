"""A compromised box wrote replies nobody asked for, as fast as its tmpfs let it (~50 MiB/s),
and the daemon took them all into the one state DB on the host's disk, whose filling then
failed every other session (found by a review): what one session could leave there was bounded
only by ``max_rows`` x ``max_reply_bytes`` (~1 TiB), and ingestion pruned what it took, so the
box's own quota never stopped it. Now each session's replies are held to bounds
(domain/reply_bounds.py) and what is not taken stays in the box's own queue. The real services
over real SQLCipher files (reply_world.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from ironclawd.domain.messages import QueueLimits
from ironclawd.domain.reply_bounds import stored_bytes
from tests.unit.reply_world import AGENT, world

SID, OTHER = "fl00d5e55i0n", "qu1e75e55i0n"
KIB = 1024


def test_replies_to_messages_nobody_sent_stay_in_the_boxs_queue(tmp_path: Path) -> None:
    async def go() -> tuple[list[int], list[int], int]:
        w = world(tmp_path)
        await w.sessions.create(AGENT, SID)
        await w.messages.send(SID, "hello")
        flood = "x" * (64 * KIB)
        # Its answer, then 40 more to the same message and 5 to a message nobody sent.
        last = await w.write(SID, [(1, "the answer"), *[(1, flood)] * 40, *[(7, flood)] * 5])
        got = [seq for seq, _irt, _body in await w.replies(SID)]
        left = w.left_in_box(SID)
        await w.sessions.close()
        return got, left, last

    got, left, last = asyncio.run(go())
    assert len(got) < last, f"all {last} replies, {last * 64} KiB, were taken"
    per_message = QueueLimits().max_replies_per_message
    assert got == list(range(1, per_message + 1))
    assert set(range(per_message + 1, last + 1)) <= set(left)  # not taken: still in its queue


def test_a_reply_to_an_older_message_than_one_answered_is_not_taken(tmp_path: Path) -> None:
    async def go() -> list[tuple[int, int, str]]:
        w = world(tmp_path)
        await w.sessions.create(AGENT, SID)
        for text in ("one", "two"):
            await w.messages.send(SID, text)
        await w.write(SID, [(2, "to two"), (1, "to one, after two"), (0, "to none")])
        got = await w.replies(SID)
        await w.sessions.close()
        return got

    assert asyncio.run(go()) == [(1, 2, "to two")]


def test_a_session_at_its_byte_bound_takes_no_more_and_another_is_served(tmp_path: Path) -> None:
    limits = QueueLimits(max_ingested_bytes=1024 * KIB)
    body = "y" * (100 * KIB)
    taken = limits.max_ingested_bytes // stored_bytes(len(body))

    async def go() -> None:
        w = world(tmp_path, limits)
        for sid in (SID, OTHER):
            await w.sessions.create(AGENT, sid)
        for n in range(1, 31):
            await w.messages.send(SID, f"message {n}")
        # An agent that answers each message once, in order, but at length.
        last = await w.write(SID, [(n, body) for n in range(1, 31)])
        got = await w.replies(SID)
        assert [seq for seq, *_ in got] == list(range(1, taken + 1))
        usage = w.store.reply_usage(SID)
        assert usage.bytes == taken * stored_bytes(len(body)) <= limits.max_ingested_bytes
        assert (usage.answered, usage.run) == (taken, 1)
        assert set(range(taken + 1, last + 1)) <= set(w.left_in_box(SID))
        # Every other session is served as before.
        await w.messages.send(OTHER, "are you there?")
        await w.write(OTHER, [(1, "yes")])
        assert await w.replies(OTHER) == [(1, 1, "yes")]
        await w.sessions.close()
        # A restart of the daemon does not start the count again: it is in the state DB.
        again = world(tmp_path, limits, store=w.store)
        assert await again.messages.ingest(SID) == 0
        assert again.store.reply_usage(SID) == usage
        # A higher bound takes the rest.
        more = world(tmp_path, replace(limits, max_ingested_bytes=64 * 1024 * KIB), w.store)
        assert await more.messages.ingest(SID) == 30 - taken
        w.store.close()

    asyncio.run(go())


def test_an_agent_that_answers_each_message_once_is_never_held(tmp_path: Path) -> None:
    """The agent (agent/loop.py) answers each message once, in order; a body over
    ``max_reply_bytes`` is ingested as a placeholder, and counts as that message's answer."""

    async def go() -> list[tuple[int, int]]:
        w = world(tmp_path)
        await w.sessions.create(AGENT, SID)
        for n in range(1, 41):
            await w.messages.send(SID, f"message {n}")
            long = n == 7
            text = "z" * (QueueLimits().max_reply_bytes + 1) if long else f"answer {n}"
            await w.write(SID, [(n, text)])
        got = [(seq, irt) for seq, irt, _body in await w.replies(SID)]
        await w.sessions.close()
        return got

    expected = [(n, 0 if n == 7 else n) for n in range(1, 41)]
    assert asyncio.run(go()) == expected


def test_a_held_session_rereads_only_its_held_row_at_each_announcement(tmp_path: Path) -> None:
    """Held at a row, a session's next ingests read that row alone (it decides whether the
    hold still applies), not a whole batch: a held box announcing without writing had the
    daemon read and decrypt up to 2 MiB each time (found by a review of this stop's diff)."""
    asked: list[int] = []

    async def go() -> None:
        w = world(tmp_path)
        await w.sessions.create(AGENT, SID)
        await w.messages.send(SID, "hello")
        flood = "z" * (16 * KIB)
        last = await w.write(SID, [(1, "the answer"), *[(7, flood)] * 30])
        assert [seq for seq, _irt, _body in await w.replies(SID)] == [1]
        read = w.messages._read_batch

        def counting(sid: str, after: int, batch: int) -> object:
            asked.append(batch)
            return read(sid, after, batch)

        w.messages._read_batch = counting  # type: ignore[method-assign, assignment]
        for _ in range(3):
            assert await w.messages.ingest(SID, last) == 0
        await w.sessions.close()

    asyncio.run(go())
    assert asked == [1, 1, 1], asked
