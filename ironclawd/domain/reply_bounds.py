"""What one session's replies may take of the state DB, and which replies answer a message.
Pure.

The state DB keeps every reply a session's agent wrote for the session's life (they go with
it: ``destroy_session_data``), and one state DB, on the host's disk, serves every session. So
ingestion holds each session to bounds (``[queues]``): the bytes its replies take there
(``max_ingested_bytes``, counted as ``stored_bytes``), how many there are (``max_rows``) and how
many answer one inbound message (``max_replies_per_message``). And a reply must answer a message
that was sent, none before the last one answered: the agent answers each message once, in order
(agent/loop.py). A box wrote replies to messages nobody sent, at ~50 MiB/s, and the state DB
took them all (found by a review). A row that would cross a bound, or answers no message sent,
is not ingested: it and the rows after it stay in the session's outbound queue, on the
session's own tmpfs (``[queues] outbound_bytes``), never the host's disk.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ironclawd.domain.messages import MAX_SEQ, QueueLimits

# The bounds a reload applies (config_reload.py): one raised lets a held session's replies be
# taken without a restart.
LIVE_KEYS = ("max_rows", "max_ingested_bytes", "max_replies_per_message")
# max_rows and max_ingested_bytes count over a session's whole life, so an honest long-lived
# session reaches them too (256 MiB is ~64,000 answers of 2-3 KB: ~130 days of 500 a day). The
# operator is told when a session's replies pass this share of one, before ingestion holds.
NEAR_SHARE = 0.8

# How SQLite (fileformat2 §1.6) lays out a reply's row in the state DB, whose pages are 4096
# bytes of which SQLCipher keeps 80 (its IV and HMAC). A row's payload is its body and up to 92
# bytes more (the session id, up to 32 bytes; seq, in_reply_to, created_at, the 32-byte chain,
# the record's header). It is a cell on a leaf page of the table (4008 bytes for cells), with 10
# bytes of its own (sizes, rowid, pointer); a payload over MAX_LOCAL keeps a part there and the
# rest on overflow pages of 4012 bytes. Its key (session id, seq) is an entry on the index's
# pages: 64 bytes of them, measured.
PAGE_BYTES = 4096
USABLE_BYTES = PAGE_BYTES - 80
CELLS_BYTES = USABLE_BYTES - 8
MAX_LOCAL = USABLE_BYTES - 35
MIN_LOCAL = (USABLE_BYTES - 12) * 32 // 255 - 23
OVERFLOW_CONTENT = USABLE_BYTES - 4
ROW_BYTES = 92
CELL_BYTES = 10
INDEX_BYTES = 64


@dataclass(frozen=True)
class ReplyUsage:
    """What a session's ingested replies take (kept in the state DB with them)."""

    bytes: int = 0  # ``stored_bytes`` over all of them
    answered: int = 0  # the newest inbound seq one answered (0: none yet)
    run: int = 0  # replies since ``answered`` was first answered, that one included


def stored_bytes(body: int) -> int:
    """What a reply whose body has ``body`` bytes takes in the state DB: its cell's share of a
    leaf page (SQLite keeps whole cells on a page: rows of 1950 bytes took a 4 KiB page each,
    so counting bodies alone let a box fill twice its bound), its overflow pages and its index
    entry. Measured on the real file from no body to 1 MiB, it is within 1% of what the file
    grew by, or over it (``tests/unit/test_reply_bounds.py``)."""
    payload = body + ROW_BYTES
    local, overflow = payload, 0
    if payload > MAX_LOCAL:
        kept = MIN_LOCAL + (payload - MIN_LOCAL) % OVERFLOW_CONTENT
        local = kept if kept <= MAX_LOCAL else MIN_LOCAL
        overflow = -(-(payload - local) // OVERFLOW_CONTENT)
    cell = local + CELL_BYTES + (4 if overflow else 0)
    return PAGE_BYTES // (CELLS_BYTES // cell) + overflow * PAGE_BYTES + INDEX_BYTES


def answers(in_reply_to: object) -> int:
    """The inbound seq a row says it answers, as the agent wrote it; 0 if it names none."""
    if isinstance(in_reply_to, bool) or not isinstance(in_reply_to, int):
        return 0
    return in_reply_to if 1 <= in_reply_to <= MAX_SEQ else 0


def admit(
    usage: ReplyUsage, seq: int, in_reply_to: object, body: int, *, sent: int, limits: QueueLimits
) -> tuple[ReplyUsage, str]:
    """The session's usage once reply ``seq`` is ingested, and ""; or ``usage`` as it was and
    why the reply is not ingested. ``in_reply_to`` is the row's own (a row that names no
    message, a placeholder's say, counts towards the message answered last); ``body`` its
    stored body's bytes; ``sent`` the newest inbound seq, read after the row was."""
    target = answers(in_reply_to) or usage.answered
    run = usage.run + 1 if target == usage.answered else 1
    total = usage.bytes + stored_bytes(body)
    why = _unasked(seq, target, usage.answered, sent) or _over(seq, target, run, total, limits)
    return (usage, why) if why else (ReplyUsage(total, target, run), "")


def _unasked(seq: int, target: int, answered: int, sent: int) -> str:
    if target == 0:
        return f"reply {seq} answers no message"
    if target > sent:
        return f"reply {seq} answers message {target}, which was never sent"
    if target < answered:
        return f"reply {seq} answers message {target} after message {answered}"
    return ""


def _over(seq: int, target: int, run: int, total: int, limits: QueueLimits) -> str:
    if seq > limits.max_rows:
        return f"reply {seq} would be over [queues] max_rows ({limits.max_rows})"
    if run > limits.max_replies_per_message:
        return (
            f"reply {seq} would be reply {run} to message {target}, over [queues] "
            f"max_replies_per_message ({limits.max_replies_per_message})"
        )
    if total > limits.max_ingested_bytes:
        return (
            f"reply {seq} would bring the session's replies to {total} bytes, over [queues] "
            f"max_ingested_bytes ({limits.max_ingested_bytes})"
        )
    return ""


def with_bounds(limits: QueueLimits, bounds: QueueLimits) -> QueueLimits:
    """``limits`` with the bounds a reload applies taken from ``bounds``."""
    return replace(limits, **{key: getattr(bounds, key) for key in LIVE_KEYS})


def nearing(
    before: ReplyUsage, after: ReplyUsage, last: tuple[int, int], limits: QueueLimits
) -> str:
    """What replies just taken brought past ``NEAR_SHARE`` of a lifetime bound, said once per
    crossing ("" if they crossed none): ``before`` and ``after`` the session's usage, ``last``
    its last reply's seq before and after."""
    for key, was, now, bound in (
        ("max_ingested_bytes", before.bytes, after.bytes, limits.max_ingested_bytes),
        ("max_rows", last[0], last[1], limits.max_rows),
    ):
        if was < bound * NEAR_SHARE <= now:
            return f"its replies have reached {now} of [queues] {key} ({bound})"
    return ""
