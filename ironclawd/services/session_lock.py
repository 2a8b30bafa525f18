"""A session's lock: every command and transition of a session runs under it
(``SessionService.lock``)."""

from __future__ import annotations

import asyncio
from typing import Literal


class SessionLock(asyncio.Lock):
    """A session's lock, kept in its service's table while it is held or awaited and dropped
    from it after: one dropped while a command still waited on it (a removal dropped it) was
    taken by that command while the next command on the id made a new one, and the two ran
    side by side (a stop tore down the sandbox a create was starting); and an id that never
    named a session kept its lock for good."""

    def __init__(self, table: dict[str, SessionLock], sid: str) -> None:
        super().__init__()
        self._table = table
        self._sid = sid
        self._users = 0  # holding or waiting

    async def acquire(self) -> Literal[True]:
        self._users += 1
        try:
            return await super().acquire()
        except BaseException:
            self._leave()
            raise

    def release(self) -> None:
        super().release()
        self._leave()

    def _leave(self) -> None:
        self._users -= 1
        if self._users == 0 and self._table.get(self._sid) is self:
            del self._table[self._sid]
