"""``ports.AuditSink`` that keeps every record in memory."""

from __future__ import annotations


class RecordingAudit:
    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, object]]] = []
        self.soon: list[tuple[str, str, dict[str, object]]] = []  # the record_soon ones

    def record(self, event: str, actor: str, **fields: object) -> None:
        self.records.append((event, actor, fields))

    def record_soon(self, event: str, actor: str, **fields: object) -> None:
        self.soon.append((event, actor, fields))
        self.records.append((event, actor, fields))

    def events(self) -> list[str]:
        return [event for event, _, _ in self.records]
