"""``ports.AuditSink`` that keeps every record in memory and lets a test await one."""

from __future__ import annotations

import asyncio


class RecordingAudit:
    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, object]]] = []
        self.soon: list[tuple[str, str, dict[str, object]]] = []  # the record_soon ones
        self._waiters: dict[str, list[asyncio.Event]] = {}

    def record(self, event: str, actor: str, **fields: object) -> None:
        self.records.append((event, actor, fields))
        for waiter in self._waiters.pop(event, []):
            waiter.set()

    def record_soon(self, event: str, actor: str, **fields: object) -> None:
        self.soon.append((event, actor, fields))
        self.record(event, actor, **fields)

    def events(self) -> list[str]:
        return [event for event, _, _ in self.records]

    async def next(self, event: str) -> None:
        """Return when ``event`` is next recorded (the caller bounds the wait)."""
        waiter = asyncio.Event()
        self._waiters.setdefault(event, []).append(waiter)
        await waiter.wait()
