"""``ports.AuditSink`` that keeps every record in memory and lets a test await one, and
``ports.AuditLogFile`` as a list of records."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from typing import Any

from ironclawd.domain.audit import check_fields
from ironclawd.errors import HostError
from ironclawd.ports import VerifyResult
from ironclawd.store.audit import GENESIS, MAX_RECORD, canonical


class RecordingAudit:
    """``ports.AuditSink`` in a list. It refuses what the real one (services/audit.py over
    store/audit.py) refuses: a field named like the chain's own at once; a record that cannot
    be written (not JSON, over MAX_RECORD) raises from ``record`` and is lost alone from
    ``record_soon``. tests/contract/test_audit_sink.py holds the two to one contract."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, object]]] = []
        self.soon: list[tuple[str, str, dict[str, object]]] = []  # the record_soon ones
        self.lost: list[tuple[str, str, dict[str, object]]] = []  # record_soon ones not written
        self._waiters: dict[str, list[asyncio.Event]] = {}

    def record(self, event: str, actor: str, **fields: object) -> None:
        check_fields(event, fields)
        # The line the real log would write, with the chain's own fields at their full width
        # (a MAC or link is 64 hex digits) so the size rule cuts where the real one does.
        line = {"seq": len(self.records) + 1, "time": 0.0, "event": event, "actor": actor,
                **fields, "prev": GENESIS, "mac": GENESIS}  # fmt: skip
        size = len(canonical(line)) + 1  # TypeError: not JSON; + the newline
        if size > MAX_RECORD:
            raise HostError(f"audit record for {event} is too large ({size} bytes)")
        self.records.append((event, actor, fields))
        for waiter in self._waiters.pop(event, []):
            waiter.set()

    def record_soon(self, event: str, actor: str, **fields: object) -> None:
        check_fields(event, fields)
        self.soon.append((event, actor, fields))
        try:
            self.record(event, actor, **fields)
        except (HostError, TypeError, ValueError):
            self.lost.append((event, actor, fields))

    def events(self) -> list[str]:
        return [event for event, _, _ in self.records]

    async def next(self, event: str) -> None:
        """Return when ``event`` is next recorded (the caller bounds the wait)."""
        waiter = asyncio.Event()
        self._waiters.setdefault(event, []).append(waiter)
        await waiter.wait()


class MemoryAuditLog:
    """``ports.AuditLogFile`` in a list: the same numbering, ``prev`` links and head checks as
    store/audit.py, with a SHA-256 in place of the keyed MAC. ``appended`` names each event."""

    def __init__(self, now: Callable[[], float] = lambda: 0.0) -> None:
        self.rows: list[dict[str, Any]] = []
        self.appended: list[str] = []
        self.append_only = False
        self.syncs = 0
        self.closed = False
        self._now = now
        self._seq, self._prev = 0, GENESIS

    @property
    def head(self) -> tuple[int, str]:
        return self._seq, self._prev

    def continue_after(self, remembered: tuple[int, str]) -> bool:
        seq, mac = remembered
        if seq > self._seq or (seq == self._seq and mac != self._prev):
            self._seq, self._prev = seq, mac
            return True
        return False

    def append(self, event: str, actor: str, *, sync: bool = True, **fields: Any) -> dict[str, Any]:
        check_fields(event, fields)
        record: dict[str, Any] = {"seq": self._seq + 1, "time": self._now(), "event": event,
                                  "actor": actor, **fields, "prev": self._prev}  # fmt: skip
        record["mac"] = _digest(record)
        self.rows.append(record)
        self.appended.append(event)
        self._seq, self._prev = record["seq"], record["mac"]
        if sync:
            self.sync()
        return dict(record)

    def sync(self) -> None:
        self.syncs += 1

    def verify(self, expected_head: tuple[int, str] | None = None) -> VerifyResult:
        prev, count = GENESIS, 0
        for line_no, record in enumerate(self.rows, start=1):
            if record.get("seq") != line_no:
                found = record.get("seq")
                problem = f"expected seq {line_no}, found {found!r} (deleted, reordered, inserted)"
                return VerifyResult(False, count, line_no, problem)
            if record.get("mac") != _digest(record):
                return VerifyResult(False, count, line_no, "record altered (MAC mismatch)")
            if record.get("prev") != prev:
                return VerifyResult(False, count, line_no, "chain broken (prev does not match)")
            prev, count = str(record["mac"]), count + 1
        if expected_head is not None and expected_head[0] > count:
            return VerifyResult(
                False, count, count + 1, f"log truncated: {expected_head[0]} records were written"
            )
        if expected_head is not None and expected_head[0] == count and expected_head[1] != prev:
            return VerifyResult(False, count, count, "last record differs from the remembered one")
        return VerifyResult(True, count)

    def read(self, after: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        return [dict(r) for r in self.rows if int(r.get("seq", 0)) > after][:limit]

    def close(self) -> None:
        self.closed = True


def _digest(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "mac"}
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
