"""What the message service keeps in memory of one session's ingested replies: the newest one's
seq and chain (where ingestion goes on, and what a send reports as ``replies_before``) and the
last few replies (what a following watcher is sent). So neither a send, an ingest nor a
watcher that keeps up reads the state DB on the event loop. The state DB stays the record: the
tail changes only after the DB took the rows, and a watcher further behind reads the DB (in a
thread)."""

from __future__ import annotations

from collections import deque

from ironclawd.domain.messages import Reply
from ironclawd.domain.reply_bounds import ReplyUsage

RECENT_REPLIES = 1024
RECENT_BYTES = 4 * 1024 * 1024  # of bodies, per session


class ReplyTail:
    def __init__(self, last: int, chain: bytes, usage: ReplyUsage | None = None) -> None:
        self.last = last
        self.chain = chain
        self.usage = usage or ReplyUsage()  # what they take in the state DB (reply_bounds.py)
        self._recent: deque[Reply] = deque()
        self._bytes = 0

    def add(self, replies: list[Reply], usage: ReplyUsage | None = None) -> None:
        """Replies the state DB has just taken: seqs last+1, last+2, ... in order; ``usage``:
        what the session's replies take with them."""
        for reply in replies:
            if reply.seq != self.last + 1:
                raise ValueError(f"reply {reply.seq} does not follow {self.last}")
            self._recent.append(reply)
            self._bytes += len(reply.body)
            self.last, self.chain = reply.seq, reply.chain
        if usage is not None:
            self.usage = usage
        while self._recent and (len(self._recent) > RECENT_REPLIES or self._bytes > RECENT_BYTES):
            self._bytes -= len(self._recent.popleft().body)

    def after(self, after: int, limit: int) -> list[Reply] | None:
        """Up to ``limit`` replies with seq > ``after`` if memory holds them ([] if there is
        none yet); None if the state DB must be asked."""
        if after >= self.last:
            return []
        if not self._recent or self._recent[0].seq > after + 1:
            return None
        # Seqs are consecutive, so the wanted ones are the newest few: index from the end (a
        # deque indexes from whichever end is nearer; iterating from the front is O(n)).
        count = min(self.last - after, limit)
        newest = len(self._recent) - (self.last - after)
        return [self._recent[i] for i in range(newest, newest + count)]
