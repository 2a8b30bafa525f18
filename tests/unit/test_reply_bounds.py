"""The bounds a session's replies are held to (domain/reply_bounds.py): which reply answers a
message sent, what a reply takes in the state DB (measured against the real file), and the
state DB keeping that with the replies, an older daemon's sessions included."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ironclawd.domain.messages import QueueLimits, Reply
from ironclawd.domain.reply_bounds import ReplyUsage, admit, stored_bytes
from ironclawd.store import state
from ironclawd.store.state import StateStore

KEY = bytes(range(32))
LIMITS = QueueLimits(max_ingested_bytes=10_000, max_replies_per_message=3)


@pytest.mark.parametrize(
    ("usage", "in_reply_to", "sent", "after", "why"),
    [
        (ReplyUsage(), 1, 1, ReplyUsage(169, 1, 1), ""),
        (ReplyUsage(169, 1, 1), 1, 1, ReplyUsage(338, 1, 2), ""),
        (ReplyUsage(169, 1, 3), 2, 2, ReplyUsage(338, 2, 1), ""),  # a new message: a new count
        (ReplyUsage(169, 2, 1), None, 2, ReplyUsage(338, 2, 2), ""),  # a placeholder's counts
        (ReplyUsage(169, 2, 1), 0, 2, ReplyUsage(338, 2, 2), ""),
        (ReplyUsage(), 0, 5, None, "reply 9 answers no message"),
        (ReplyUsage(), "1", 5, None, "reply 9 answers no message"),
        (ReplyUsage(), 2, 1, None, "reply 9 answers message 2, which was never sent"),
        (ReplyUsage(), 2**62, 1, None, f"reply 9 answers message {2**62}, which was never sent"),
        (ReplyUsage(169, 4, 1), 3, 9, None, "reply 9 answers message 3 after message 4"),
        (ReplyUsage(507, 4, 3), 4, 9, None,
         "reply 9 would be reply 4 to message 4, over [queues] max_replies_per_message (3)"),
        (ReplyUsage(9900, 4, 1), 5, 9, None,
         "reply 9 would bring the session's replies to 10069 bytes, over [queues] "
         "max_ingested_bytes (10000)"),
    ],
)  # fmt: skip
def test_a_reply_is_taken_only_within_the_sessions_bounds(
    usage: ReplyUsage, in_reply_to: object, sent: int, after: ReplyUsage | None, why: str
) -> None:
    assert admit(usage, 9, in_reply_to, 0, sent=sent, limits=LIMITS) == (after or usage, why)


def _file_bytes(store: StateStore, path: Path) -> int:
    with store.shared("checkpointing") as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path.stat().st_size


@pytest.mark.parametrize("sid_length", [12, 32])
def test_what_a_reply_takes_is_what_the_state_db_grows_by(tmp_path: Path, sid_length: int) -> None:
    """Counting bodies alone let rows of ~1950 bytes, one to a 4 KiB page, fill twice the
    bound. Each size is the file's growth over rows of one session, ids of either length
    (12 characters: a new session's own; 32: the longest)."""
    path = tmp_path / "state.db"
    store = StateStore(path, KEY)
    try:
        for n, body in enumerate((0, 100, 1300, 1900, 1950, 3900, 3990, 6000, 65536, 1 << 20)):
            sid = f"{n:02d}".ljust(sid_length, "s")
            count = max(20, min(400, (8 << 20) // max(body, 1)))
            before = _file_bytes(store, path)
            for start in range(1, count + 1, 100):
                seqs = range(start, min(count, start + 99) + 1)
                store.add_replies(
                    sid, [Reply(n, n, 1.7e9, "b" * body, os.urandom(32)) for n in seqs]
                )
            grown = (_file_bytes(store, path) - before) / count
            counted = stored_bytes(body)
            assert counted >= 0.98 * grown, (body, counted, grown)  # never much less
            assert counted <= 1.2 * grown + 80, (body, counted, grown)  # nor much more
    finally:
        store.close()


def test_an_older_daemons_replies_are_counted_once_at_the_upgrade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.db"
    with monkeypatch.context() as older:
        older.setattr(state, "SCHEMA_VERSION", 9)
        store = StateStore(path, KEY)
        bodies = ["a" * 10, "b" * 5000, "[ironclawd refused reply 3: body is not valid UTF-8]",
                  "c" * 70, "d"]  # fmt: skip
        answers = [1, 2, 0, 2, 2]
        rows = enumerate(zip(answers, bodies, strict=True), 1)
        store.add_replies("upgraded0001", [Reply(n, a, 1.0, b, bytes(32)) for n, (a, b) in rows])
        store.close()
    store = StateStore(path, KEY)
    try:
        assert store.reply_usage("upgraded0001") == ReplyUsage(
            sum(stored_bytes(len(b)) for b in bodies), 2, 3
        )
        assert store.reply_usage("never0000001") == ReplyUsage()
    finally:
        store.close()


def test_a_reply_past_max_rows_is_not_taken() -> None:
    limits = QueueLimits(max_rows=8)
    assert admit(ReplyUsage(), 8, 1, 0, sent=1, limits=limits)[1] == ""
    why = "reply 9 would be over [queues] max_rows (8)"
    assert admit(ReplyUsage(), 9, 1, 0, sent=1, limits=limits) == (ReplyUsage(), why)
