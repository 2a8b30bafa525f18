"""The host's "ingested <seq>" lines (services/messaging.py ``_offer_pruning``): every
``prune_after_rows`` replies taken, and whenever the agent asks. An agent whose outbound.db is
full announces its newest seq again (agent/loop.py); so does every agent's hello. Such an
announcement brings nothing new, and is answered with all that was taken, said again if it was
said before: a line sent while the agent was away was lost, and nothing else was offered until
256 more replies were taken, which a full queue never writes. A reload that takes a held
session's replies offers them all at once. The real services over real SQLCipher files
(reply_world.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ironclawd.domain.messages import QueueLimits
from ironclawd.ports import RESYNC
from tests.unit.reply_world import AGENT, World, world

SID = "pr0ne5e55i0n"


def offers(w: World) -> list[int]:
    """The seqs of the "ingested" lines that reached the agent."""
    return [int(line.split()[1]) for line in w.control.delivered.get(SID, [])
            if line.startswith(b"ingested ")]  # fmt: skip


async def announce(w: World, seq: int) -> None:
    assert w.control.listener is not None
    await w.control.listener(SID, "outbound", seq)


def test_an_agent_that_asks_is_told_what_it_may_prune_even_if_it_was_told_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        w = world(tmp_path, QueueLimits(prune_after_rows=4))
        await w.sessions.create(AGENT, SID)
        for n in range(1, 7):
            await w.messages.send(SID, f"message {n}")
        real_send = w.control.send

        async def away(sid: str, event: str, value: int) -> bool:
            w.control.sent.append((sid, event, value))
            return False  # the agent was not connected: the line is lost

        monkeypatch.setattr(w.control, "send", away)
        await w.write(SID, [(n, f"answer {n}") for n in range(1, 5)])
        assert (SID, "ingested", 4) in w.control.sent
        monkeypatch.setattr(w.control, "send", real_send)
        await w.write(SID, [(5, "answer 5")])
        assert offers(w) == []  # one reply more: not yet another offer
        await announce(w, 5)  # nothing new: the agent asks
        assert offers(w) == [5]
        assert w.store.pruned(SID) == 5  # recorded before it was said
        await announce(w, 5)  # said again: it may have missed it
        assert offers(w) == [5, 5]
        # Not the newest reply, nor held: no answer (a box that announces rows it never wrote
        # and never reads would fill its own socket: found by test_ingest's symlink swaps).
        await announce(w, 3)
        await announce(w, 9)
        assert offers(w) == [5, 5]
        await w.write(SID, [(6, "answer 6")])  # something new: no offer until 4 more
        assert offers(w) == [5, 5]
        assert len(await w.replies(SID)) == 6
        await w.sessions.close()
        w.store.close()

    asyncio.run(go())


def test_a_held_session_is_offered_its_replies_when_a_reload_takes_them(tmp_path: Path) -> None:
    """Held, the agent's queue fills; the reload's ingest takes fewer than prune_after_rows
    replies, which the agent could not write more of to reach an offer."""

    async def go() -> None:
        w = world(tmp_path, QueueLimits(max_replies_per_message=2))
        await w.sessions.create(AGENT, SID)
        await w.messages.send(SID, "hello")
        await w.write(SID, [(1, "one"), (1, "two"), (1, "three")])
        assert "max_replies_per_message" in w.messages.held(SID)
        await announce(w, 3)  # its queue is full: it asks, and nothing was taken
        assert offers(w) == [2]
        w.messages.configure(QueueLimits(max_replies_per_message=3))
        for _ in range(100):
            if offers(w) == [2, 3]:
                break
            await asyncio.sleep(0.02)
        assert offers(w) == [2, 3]
        assert w.messages.held(SID) == ""
        await w.sessions.close()
        w.store.close()

    asyncio.run(go())


def test_a_held_session_is_offered_its_replies_when_the_next_daemon_takes_them(
    tmp_path: Path,
) -> None:
    """A clean restart with the bound raised: the next daemon reads the held session's queue
    in full (RESYNC, test_reply_holds.py) and offers what it took at once."""

    async def go() -> None:
        w = world(tmp_path, QueueLimits(max_replies_per_message=2))
        await w.sessions.create(AGENT, SID)
        await w.messages.send(SID, "hello")
        await w.write(SID, [(1, "one"), (1, "two"), (1, "three")])
        after = world(tmp_path, QueueLimits(max_replies_per_message=3), store=w.store)
        assert after.control.listener is not None
        await after.control.listener(SID, RESYNC, 0)  # its restored connection, marked
        assert len(await after.replies(SID)) == 3
        assert (SID, "ingested", 3) in after.control.sent
        await w.sessions.close()
        w.store.close()

    asyncio.run(go())
