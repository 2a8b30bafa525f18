"""The audit trail: every record goes to the hash-chained log and its head to the state DB."""

from __future__ import annotations

import logging
from typing import Any

from ironclawd.errors import HostError
from ironclawd.store.audit import AuditLog, VerifyResult
from ironclawd.store.state import StateStore

log = logging.getLogger("ironclawd.audit")


class Audit:
    def __init__(self, audit_log: AuditLog, store: StateStore) -> None:
        self._log = audit_log
        self._store = store
        if not audit_log.append_only:
            log.warning(
                "audit log: the filesystem has no append-only flag; relying on the MAC chain"
            )
        head = store.audit_head()
        if head is not None and audit_log.continue_after(head):
            log.critical(
                "audit log: the file ends before the remembered record %d: records were removed "
                "while ironclawd was down; new records continue after %d (audit verify names "
                "the gap)",
                head[0],
                head[0],
            )

    def record(self, event: str, actor: str, **fields: Any) -> None:
        try:
            record = self._log.append(event, actor, **fields)
            self._store.set_audit_head(int(record["seq"]), str(record["mac"]))
        except HostError as exc:
            # Losing an audit record silently would be worse than a loud error in the journal.
            log.critical("AUDIT RECORD LOST (%s by %s): %s", event, actor, exc)
            raise

    def verify(self) -> VerifyResult:
        return self._log.verify(self._store.audit_head())

    def read(self, after: int, limit: int) -> list[dict[str, Any]]:
        return self._log.read(after, limit)

    @property
    def append_only(self) -> bool:
        return self._log.append_only
