"""Per-session lanes for work on what a session's agent wrote.

Reading outbound.db runs in a thread (SQLCipher is blocking). With the loop's shared default
executor, a few hostile sessions whose reads hung held every worker, and every other session's
sends waited behind them. Here each session has its own single worker: at most one read per
session is in flight, a caller waits at most ``timeout`` (for its turn and its read together),
and a read that never returns occupies only its own session's lane.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ironclawd.errors import HostError

T = TypeVar("T")


@dataclass
class _Lane:
    executor: ThreadPoolExecutor
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    busy: asyncio.Future[Any] | None = None


class Lanes:
    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._lanes: dict[str, _Lane] = {}

    async def run(self, sid: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in ``sid``'s own worker; HostError if it does not finish in time."""
        lane = self._lanes.get(sid)
        if lane is None:
            lane = _Lane(ThreadPoolExecutor(1, thread_name_prefix=f"lane-{sid}"))
            self._lanes[sid] = lane
        try:
            async with asyncio.timeout(self._timeout), lane.lock:
                if lane.busy is not None and not lane.busy.done():
                    # A read that timed out earlier is still running: wait for it (bounded).
                    await asyncio.wait([lane.busy])
                future = asyncio.get_running_loop().run_in_executor(lane.executor, fn, *args)
                future.add_done_callback(_consume)
                lane.busy = future
                return await asyncio.shield(future)
        except TimeoutError:
            raise HostError(
                f"session {sid}: reading its outbound queue did not finish in {self._timeout:g}s"
            ) from None

    def close(self, sid: str, then: Callable[[], None] | None = None) -> None:
        """The session is gone: its worker ends once what it runs returns; ``then`` runs on the
        loop after that (at once if nothing runs), so it never pulls anything from under a read."""
        lane = self._lanes.pop(sid, None)
        if lane is not None:
            lane.executor.shutdown(wait=False, cancel_futures=True)
            if then is not None and lane.busy is not None and not lane.busy.done():
                lane.busy.add_done_callback(lambda _future: then())
                return
        if then is not None:
            then()


def _consume(future: asyncio.Future[Any]) -> None:
    # A read whose caller gave up still finishes; its error must not be reported as unretrieved.
    if not future.cancelled():
        future.exception()
