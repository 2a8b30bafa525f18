"""Watching running sandboxes: a task per session waits for its agent's control connection to
drop (no polling), and an idle timer per session stops it after ``idle_timeout`` without
activity. Every task is owned by the watcher and ended by ``close``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ironclawd.ports import ControlPlane


class OwnedTasks:
    """Background tasks a service owns: kept referenced while they run, cancelled and awaited
    by ``close`` (a task's failure is its own to log; ``close`` never raises it)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    async def settle(self, grace: float) -> None:
        """Give the running tasks ``grace`` seconds to finish (those left keep running)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class SessionWatcher:
    """Calls ``on_disconnect(sid)`` when a watched session's agent disconnects and
    ``on_idle(sid)`` when its idle timer fires; both run as tasks the watcher owns."""

    def __init__(
        self,
        control: ControlPlane,
        idle_timeout: float,
        on_disconnect: Callable[[str], Awaitable[None]],
        on_idle: Callable[[str], Coroutine[Any, Any, None]],
    ) -> None:
        self._control = control
        self._idle_timeout = idle_timeout
        self._on_disconnect = on_disconnect
        self._on_idle = on_idle
        self._idle_timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks = OwnedTasks()

    def watch(self, sid: str) -> None:
        """When the agent's control connection drops, call ``on_disconnect`` (no polling)."""
        self._tasks.spawn(self._watch_one(sid))

    async def _watch_one(self, sid: str) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._control.wait_disconnect(sid)
            await self._on_disconnect(sid)

    def arm_idle(self, sid: str) -> None:
        """(Re)start the session's idle timer."""
        self.disarm_idle(sid)
        if self._idle_timeout <= 0:
            return
        loop = asyncio.get_running_loop()
        self._idle_timers[sid] = loop.call_later(self._idle_timeout, self._fire_idle, sid)

    def disarm_idle(self, sid: str) -> None:
        timer = self._idle_timers.pop(sid, None)
        if timer is not None:
            timer.cancel()

    def _fire_idle(self, sid: str) -> None:
        self._idle_timers.pop(sid, None)
        self._tasks.spawn(self._on_idle(sid))

    def disarm_all(self) -> None:
        for sid in list(self._idle_timers):
            self.disarm_idle(sid)

    async def close(self) -> None:
        """Disarm every timer and end every watching task."""
        self.disarm_all()
        await self._tasks.close()
