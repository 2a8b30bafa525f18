"""Session logs: the sandbox unit's journal, tailed and optionally followed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

from ironclawd.ports import JournalReader, LogLine

MAX_LINES = 10_000


async def session_logs(
    journal: JournalReader, unit: str, lines: int, follow: bool
) -> AsyncIterator[LogLine]:
    """Yield the last ``lines`` lines, then (with ``follow``) new ones until cancelled."""
    for line in await asyncio.to_thread(journal.tail, unit, min(lines or 100, MAX_LINES)):
        yield line
    if not follow:
        return
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[LogLine] = asyncio.Queue(maxsize=1000)
    stop = threading.Event()

    def pump() -> None:
        for line in journal.follow(unit, stop):
            asyncio.run_coroutine_threadsafe(queue.put(line), loop).result()

    reader = asyncio.ensure_future(asyncio.to_thread(pump))
    try:
        while True:
            yield await queue.get()
    finally:
        stop.set()
        reader.cancel()
        # Unblock a pump waiting on a full queue, then let the thread see the stop flag.
        while not queue.empty():
            queue.get_nowait()
