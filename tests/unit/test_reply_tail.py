"""The message service's memory of each session's newest replies (services/reply_tail.py):
it answers a watcher only when it holds every reply the watcher is missing, bounds itself, and
takes only replies that follow on."""

from __future__ import annotations

import pytest

from ironclawd.domain.messages import GENESIS, Reply, chain_link
from ironclawd.services import reply_tail
from ironclawd.services.reply_tail import ReplyTail


def replies(first: int, count: int, body: str = "b") -> list[Reply]:
    return [Reply(s, s, 1.0, body, chain_link(GENESIS, s, s, 1.0, body))
            for s in range(first, first + count)]  # fmt: skip


def test_a_fresh_tail_knows_only_the_newest_seq() -> None:
    tail = ReplyTail(41, b"c" * 32)
    assert tail.after(41, 10) == []  # nothing newer: no need to ask the DB
    assert tail.after(50, 10) == []
    assert tail.after(40, 10) is None  # reply 41 is in the DB only


def test_replies_added_are_served_in_order_and_the_newest_chain_kept() -> None:
    tail = ReplyTail(0, GENESIS)
    added = replies(1, 5)
    tail.add(added)
    assert (tail.last, tail.chain) == (5, added[-1].chain)
    assert tail.after(0, 10) == added
    assert tail.after(2, 2) == added[2:4]
    assert tail.after(5, 10) == []


def test_a_gap_or_a_repeat_is_refused() -> None:
    tail = ReplyTail(3, GENESIS)
    with pytest.raises(ValueError, match="does not follow"):
        tail.add(replies(5, 1))
    with pytest.raises(ValueError, match="does not follow"):
        tail.add(replies(3, 1))
    assert tail.last == 3


def test_it_keeps_a_bounded_number_of_replies_and_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reply_tail, "RECENT_REPLIES", 4)
    monkeypatch.setattr(reply_tail, "RECENT_BYTES", 1000)
    tail = ReplyTail(0, GENESIS)
    tail.add(replies(1, 10))
    assert tail.after(6, 10) == replies(7, 4)  # the last four
    assert tail.after(5, 10) is None  # reply 6 was let go: the DB has it
    tail.add(replies(11, 3, body="x" * 400))
    assert tail.after(11, 10) == replies(12, 2, body="x" * 400)  # 800 bytes kept, not 1200
    assert tail.after(10, 10) is None
