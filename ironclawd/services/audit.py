"""The audit trail: every record goes to the hash-chained log and its head to the state DB."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from ironclawd.domain.audit import check_fields
from ironclawd.domain.message_ids import MessageId, message_id
from ironclawd.errors import HostError
from ironclawd.formats import audit as audit_format
from ironclawd.ports import AuditHead, AuditLogFile, AuditSink, Clock, VerifyResult

log = logging.getLogger("ironclawd.audit")


class Audit:
    def __init__(self, audit_log: AuditLogFile, store: AuditHead) -> None:
        self._log = audit_log
        self._store = store
        self._queue: queue.SimpleQueue[tuple[str, str, dict[str, Any]] | None] = queue.SimpleQueue()
        # Owned by this object: started here, stopped (after draining) by close(). A daemon
        # thread: a start-up that fails before close() must still let the process exit.
        self._writer = threading.Thread(
            target=self._write_batches, name="audit-writer", daemon=True
        )
        self._writer.start()
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
            log.critical("AUDIT RECORD LOST (%s by %s): %s", event, actor, exc,
                         extra=message_id(MessageId.AUDIT_RECORD_LOST))  # fmt: skip
            raise

    def record_soon(self, event: str, actor: str, **fields: Any) -> None:
        """Queue a record for the group-committing writer (model calls and egress decisions,
        which sit on a request's hot path): appended in order within milliseconds, one fsync
        per batch. Gateway and lifecycle records use ``record`` and are durable on return.
        A field named like the chain's own is refused here, as ``record`` refuses it."""
        check_fields(event, fields)
        self._queue.put((event, actor, fields))

    def _write_batches(self) -> None:
        while True:
            batch = [self._queue.get()]
            while not self._queue.empty() and len(batch) < 256:
                batch.append(self._queue.get_nowait())
            last: dict[str, Any] | None = None
            for item in batch:
                if item is not None:
                    last = self._append_one(*item) or last
            if last is not None:
                try:
                    self._log.sync()
                    self._store.set_audit_head(int(last["seq"]), str(last["mac"]))
                except Exception as exc:  # the writer must outlive any failure
                    log.critical("AUDIT RECORDS NOT SYNCED (up to record %d): %s", last["seq"],
                                 exc, extra=message_id(MessageId.AUDIT_RECORD_LOST))  # fmt: skip
            if None in batch:
                return

    def _append_one(self, event: str, actor: str, fields: dict[str, Any]) -> dict[str, Any] | None:
        """Append one queued record; a record that cannot be written is lost alone, loudly:
        the records queued with it are still written, and the writer goes on."""
        try:
            return self._log.append(event, actor, sync=False, **fields)
        except Exception as exc:  # not JSON, too large, a failed write: any of them
            log.critical("AUDIT RECORD LOST (%s by %s): %s", event, actor, exc,
                         extra=message_id(MessageId.AUDIT_RECORD_LOST))  # fmt: skip
            return None

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        self._queue.put(None)
        self._writer.join(timeout=10)

    def verify(self) -> VerifyResult:
        result = self._log.verify(self._store.audit_head())
        if not result.ok and result.problem.startswith(audit_format.UNKNOWN):
            # Not the chain-broken message: a newer ironclawd's record, or a forged one.
            log.critical("audit log verification stopped at record %d (a format this version "
                         "does not know): %s", result.first_bad, result.problem)  # fmt: skip
        elif not result.ok:
            log.critical("audit log verification failed at record %d of %d: %s",
                         result.first_bad, result.records, result.problem,
                         extra=message_id(MessageId.AUDIT_CHAIN_BROKEN))  # fmt: skip
        return result

    def read(self, after: int, limit: int) -> list[dict[str, Any]]:
        return self._log.read(after, limit)

    @property
    def append_only(self) -> bool:
        return self._log.append_only


class RateWindow:
    """At most ``per_minute`` records a minute per key; counts what it left out."""

    def __init__(self, clock: Clock, per_minute: int = 20) -> None:
        self._per_minute = per_minute
        self._clock = clock
        self._window: dict[str, tuple[float, int, int]] = {}  # key: (start, recorded, dropped)

    def admit(self, key: str) -> int | None:
        """None if ``key`` is over its rate (the record is left out, and counted); else how
        many of its records were left out before this one (0 if none)."""
        now = self._clock.monotonic()
        start, recorded, dropped = self._window.get(key, (now, 0, 0))
        if now - start >= 60:
            start, recorded = now, 0
        if recorded >= self._per_minute:
            self._window[key] = (start, recorded, dropped + 1)
            return None
        self._window[key] = (start, recorded + 1, 0)
        return dropped

    def forget(self, key: str) -> int:
        """Drop ``key``'s window; how many of its records were left out and not yet counted."""
        return self._window.pop(key, (0.0, 0, 0))[2]


class Throttled:
    """Records an untrusted party can cause at will (its refused requests): at most
    ``per_minute`` a minute per key, so a looping agent cannot fill the disk through the audit
    log; the next record after a quiet spell says how many were left out (``unrecorded_before``).
    """

    def __init__(
        self,
        audit: AuditSink,
        clock: Clock,
        per_minute: int = 20,
    ) -> None:
        self._audit = audit
        self._rate = RateWindow(clock, per_minute)

    def forget(self, key: str) -> int:
        """Drop ``key``'s count (its session was removed: the id may name a new one); how many
        of its records were left out since its last one (for a summary)."""
        return self._rate.forget(key)

    def record(self, key: str, event: str, actor: str, **fields: Any) -> bool:
        """Record unless ``key`` is over its rate; whether it was recorded."""
        dropped = self._rate.admit(key)
        if dropped is None:
            return False
        if dropped:
            fields["unrecorded_before"] = dropped
        self._audit.record(event, actor, **fields)
        return True
