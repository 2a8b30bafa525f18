"""``AppendFence``: what holds back a session's sends while a removal asked to remove it only
if no message was ever queued to it (``RemoveSession`` with ``only_if_unused``) looks, and
until that removal is over.

The look must be exact: a send told its message was queued must never see it destroyed with
the session. So the fence goes up first (an append that meets it is refused, not queued), the
look waits for the appends already under way (counted in the worker threads that make them,
so a send whose caller went away is still counted), and only then reads the queue. A send that
reaches its append while the look is under way waits on the loop for the verdict: refused if
the session goes, let through if it stays, so a kept session refuses nothing; one that passed
that wait just before the fence went up waits in its worker thread for the same verdict."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator

from ironclawd.errors import NotFound


class AppendFence:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._appending: dict[str, int] = {}  # appends under way, per session
        self._up: set[str] = set()  # sessions whose appends are refused
        self._going: set[str] = set()  # of those, the ones a look found unused (removed)
        self._deciding: dict[str, asyncio.Event] = {}  # looks under way (on the loop)

    async def passable(self, sid: str) -> None:
        """On the loop, before a send's append: wait for the verdict of a look under way."""
        deciding = self._deciding.get(sid)
        if deciding is not None:
            await deciding.wait()

    @contextlib.contextmanager
    def appending(self, sid: str) -> Iterator[None]:
        """In the worker thread, around an append: NotFound while the fence is up, else the
        append is counted as under way until it ends."""
        with self._cond:
            # A look still deciding: its verdict first (a send that passed ``passable`` just
            # before the fence went up would otherwise be refused by a session that stays).
            self._cond.wait_for(lambda: sid not in self._up or sid in self._going)
            if sid in self._up:
                raise NotFound(f"session {sid} is being removed")
            self._appending[sid] = self._appending.get(sid, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                left = self._appending.pop(sid) - 1
                if left:
                    self._appending[sid] = left
                self._cond.notify_all()

    async def unused(self, sid: str, last_seq: Callable[[], int]) -> bool:
        """Put the fence up, wait for the appends under way, then say whether ``last_seq()`` (a
        worker thread's read of the queue) is 0. If so the fence stays up until ``lift`` (the
        session is removed), else it is lifted at once; also if the look fails."""
        with self._cond:
            self._up.add(sid)
        self._deciding[sid] = asyncio.Event()
        unused = False
        try:
            unused = await asyncio.to_thread(self._settled_then, sid, last_seq) == 0
        finally:
            if unused:
                with self._cond:
                    self._going.add(sid)
                    self._cond.notify_all()
            else:
                self.lift(sid)
            event = self._deciding.pop(sid, None)
            if event is not None:
                event.set()
        return unused

    def _settled_then(self, sid: str, read: Callable[[], int]) -> int:
        with self._cond:
            self._cond.wait_for(lambda: sid not in self._appending)
        return read()

    def lift(self, sid: str) -> None:
        """Let ``sid``'s appends through again (its removal is over, or failed)."""
        with self._cond:
            self._up.discard(sid)
            self._going.discard(sid)
            self._cond.notify_all()
        event = self._deciding.pop(sid, None)
        if event is not None:
            event.set()
