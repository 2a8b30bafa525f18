"""The audit log: append-only, hash-chained, keyed, fsync'd (docs/architecture.md §7).

One JSON object per line. Each record carries ``prev`` (the previous record's ``mac``) and its
own ``mac`` = HMAC-SHA256 over the canonical JSON of everything else, under a key derived from
the master key — so rewriting history needs the key, not just a text editor and sha256sum. The
file is opened O_APPEND and, where the filesystem supports it, carries the kernel's append-only
flag (FS_APPEND_FL, chattr +a): even root must drop CAP_LINUX_IMMUTABLE-guarded flag first.
The newest (seq, mac) is also kept in the state DB, so a truncated tail is detected too.

Appends are all-or-nothing: each record is one checked write; a failed or short write (a full
disk) is cut back to the last whole record before anything else is appended, and a tail torn by
a crash is cut back when the log is opened. Each cut is itself recorded (``audit.repaired``,
naming the bytes cut) before the next record, so ``verify`` tells a crash (a cut, recorded) from
tampering (a bad MAC, link or seq among the records).

A record's format version is its ``format`` field, covered by its MAC; none means version 1,
which is every record so far (ironclawd/formats/audit.py). A log that ends in a record of a
version this ironclawd does not know is refused, never appended to or cut; ``verify`` stops at
the first such record and says so, distinct from tampering.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ironclawd.domain.audit import check_fields
from ironclawd.domain.message_ids import MessageId, message_id
from ironclawd.errors import DiskFull, HostError
from ironclawd.formats import audit as audit_format
from ironclawd.ports import VerifyResult
from ironclawd.store.diskspace import is_disk_full

log = logging.getLogger("ironclawd.audit")

GENESIS = "0" * 64
FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_APPEND_FL = 0x00000020
MAX_RECORD = 64 * 1024
REPAIRED = "audit.repaired"


def canonical(record: Mapping[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


class AuditLog:
    def __init__(
        self, path: Path, key: bytes, write: Callable[[int, bytes], int] = os.write
    ) -> None:
        self._path = path
        self._key = key
        self._write = write  # os.write; tests pass a short or failing one
        self._lock = threading.Lock()
        self._size = 0  # bytes of whole records: where the next record starts
        self._cut_bytes = 0  # cut since the last audit.repaired record was written
        self._cut_reason = ""
        self._torn = False  # a failed write left bytes that could not be cut yet
        self.append_only = False
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._fd = os.open(
                path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
        except OSError as exc:
            raise HostError(f"opening audit log {path}: {exc.strerror}") from exc
        self.append_only = _set_append_only(self._fd)
        try:
            self._seq, self._prev = self._tail()
        except HostError:
            os.close(self._fd)
            raise
        self._size = self._whole_size()
        if not self._cut(self._size, "a torn record at the end (a crash or a full disk)"):
            log.critical("audit log %s: cannot cut its torn tail: new records refused", path,
                         extra=message_id(MessageId.AUDIT_LOG_DAMAGED))  # fmt: skip

    def _tail(self) -> tuple[int, str]:
        """The last record's (seq, mac); HostError if it is of a format this version does not
        know (a newer ironclawd wrote it): chaining this version's records onto it would make
        them a forgery to the version that wrote it, and its torn tail is left for it to cut."""
        seq, prev, line_no = 0, GENESIS, 0
        last: dict[str, Any] = {}
        for last, _torn, _line in self._lines():
            line_no += 1
            if audit_format.known(last):
                seq, prev = int(last.get("seq", 0)), str(last.get("mac", GENESIS))
        if not audit_format.known(last):
            raise HostError(
                f"refusing to append to audit log {self._path}: its last record (line {line_no}) "
                f"is of format version {audit_format.version(last)!r}, this ironclawd knows "
                f"version {audit_format.known_text()} (written by a newer ironclawd); the log is "
                "left as it is"
            )
        return seq, prev

    def _whole_size(self) -> int:
        """Bytes up to the last newline: what follows it is a record torn mid-write. The last
        MAX_RECORD bytes hold it (no record is longer), unless several torn writes pile up."""
        with open(self._path, "rb") as f:
            start = max(0, os.fstat(f.fileno()).st_size - MAX_RECORD - 1)
            f.seek(start)
            last = f.read().rfind(b"\n")
            if last < 0 and start > 0:
                f.seek(0)
                start, last = 0, f.read().rfind(b"\n")
        return start + last + 1

    def _lines(self) -> Iterator[tuple[dict[str, Any], bool, bytes]]:
        """(record, torn, line) per whole line. ``torn``: the line is a whole record behind the
        bytes of an earlier write torn by a full disk (written by a version without cut-back)."""
        with open(self._path, "rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    return  # a torn tail: not a record (cut at the next start)
                yield (*_parse(line), line)

    def _records(self) -> Iterator[dict[str, Any]]:
        for record, _torn, _line in self._lines():
            yield record

    @property
    def head(self) -> tuple[int, str]:
        return self._seq, self._prev

    def continue_after(self, remembered: tuple[int, str]) -> bool:
        """Chain new records to the head remembered elsewhere when the file ends before it
        (cut or emptied while the daemon was down). Numbering from the file's own tail would
        let the next record overwrite the remembered head, and the cut would verify clean;
        continuing from the remembered head keeps the gap in the file for ``verify`` to name.
        A file that is ahead of the head (a crash between append and remembering) is fine."""
        seq, mac = remembered
        with self._lock:
            if seq > self._seq or (seq == self._seq and mac != self._prev):
                self._seq, self._prev = seq, mac
                return True
        return False

    def append(self, event: str, actor: str, *, sync: bool = True, **fields: Any) -> dict[str, Any]:
        """Append one record whole or not at all; with ``sync`` (the default) fsync it before
        returning. A cut made since the last record is recorded first (``audit.repaired``)."""
        with self._lock:
            if self._cut_bytes:
                self._append(REPAIRED, "ironclawd", bytes_cut=self._cut_bytes,
                             at_offset=self._size, reason=self._cut_reason)  # fmt: skip
                self._cut_bytes, self._cut_reason = 0, ""
            record = self._append(event, actor, **fields)
            if sync:
                self.sync()
            return record

    def _append(self, event: str, actor: str, **fields: Any) -> dict[str, Any]:
        check_fields(event, fields)
        record: dict[str, Any] = {
            "seq": self._seq + 1,
            "time": round(time.time(), 6),
            "event": event,
            "actor": actor,
            **fields,
            "prev": self._prev,
        }
        record["mac"] = self._mac(record)
        line = canonical(record) + b"\n"
        if len(line) > MAX_RECORD:
            raise HostError(f"audit record for {event} is too large ({len(line)} bytes)")
        if self._torn and not self._cut(self._size, self._cut_reason):
            raise HostError(
                f"appending to audit log {self._path}: a torn record could not be cut back; "
                "refusing to append after it"
            )
        try:
            # Where this record starts: the file's size, not the bytes this process wrote.
            # Bytes appended by someone else (the append-only flag still lets root append)
            # must not make a failed write cut into the daemon's own last record.
            before = os.fstat(self._fd).st_size
        except OSError as exc:
            raise HostError(f"appending to audit log {self._path}: {exc.strerror}") from exc
        try:
            written = self._write(self._fd, line)
        except OSError as exc:
            self._cut(before, f"a failed write ({exc.strerror})")
            if is_disk_full(exc):
                raise DiskFull(
                    f"appending to audit log {self._path}: {exc.strerror}; the record was not "
                    "written"
                ) from exc
            raise HostError(f"appending to audit log {self._path}: {exc.strerror}") from exc
        if written != len(line):
            self._cut(before, f"a short write ({written} of {len(line)} bytes)")
            raise DiskFull(
                f"appending to audit log {self._path}: short write ({written} of {len(line)} "
                "bytes, the filesystem is full); the record was not written"
            )
        self._size = before + len(line)
        self._seq, self._prev = record["seq"], record["mac"]
        return record

    def _cut(self, size: int, reason: str) -> bool:
        """Cut the file back to ``size`` (the end of the last whole record); whether it now
        ends there. The append-only flag forbids truncation even to root: it is lifted for the
        cut (CAP_LINUX_IMMUTABLE, which the daemon keeps) and set again at once."""
        try:
            extra = os.fstat(self._fd).st_size - size
            if extra <= 0:
                self._torn = False
                return True
            try:
                os.ftruncate(self._fd, size)
            except PermissionError:
                if not self.append_only:
                    raise
                _set_flag(self._fd, False)
                try:
                    os.ftruncate(self._fd, size)
                finally:
                    _set_flag(self._fd, True)
        except OSError as exc:
            self._torn, self._cut_reason = True, reason
            log.critical(
                "audit log %s: cutting %s back to %d bytes: %s",
                self._path,
                reason,
                size,
                exc.strerror,
                extra=message_id(MessageId.AUDIT_LOG_DAMAGED),
            )
            return False
        log.warning("audit log %s: cut %d bytes of %s back to the last whole record", self._path,
                    extra, reason, extra=message_id(MessageId.AUDIT_LOG_DAMAGED))  # fmt: skip
        self._torn = False
        self._cut_bytes += extra
        self._cut_reason = reason
        return True

    def sync(self) -> None:
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise HostError(f"syncing audit log {self._path}: {exc.strerror}") from exc

    def _mac(self, record: Mapping[str, Any]) -> str:
        body = {k: v for k, v in record.items() if k != "mac"}
        return hmac.new(self._key, canonical(body), hashlib.sha256).hexdigest()

    def verify(self, expected_head: tuple[int, str] | None = None) -> VerifyResult:
        """Walk the whole file: every MAC, every link, seq without gaps; then the tail against
        the head remembered elsewhere (catches truncation of the last records). Cuts after a
        crash or a full disk (``audit.repaired``) and torn bytes before a whole record are not
        tampering: they are counted and named in ``problem`` of an ok result."""
        prev, count, repairs, torn_at = GENESIS, 0, 0, []
        for line_no, (record, torn, line) in enumerate(self._lines(), start=1):
            if not audit_format.known(record):
                return self._unknown_format(record, count, line_no)
            problem = self._problem(record, line_no, prev, line, torn=torn)
            if problem is not None:
                return VerifyResult(False, count, line_no, problem)
            prev = str(record["mac"])
            count += 1
            if torn:
                torn_at.append(line_no)
            repairs += record.get("event") == REPAIRED
        bad = self._check_end(count, prev, expected_head)
        if bad is not None:
            return bad
        notes = []
        if repairs:
            notes.append(f"{repairs} torn write(s) cut back after a crash or a full disk "
                         f"({REPAIRED} records)")  # fmt: skip
        if torn_at:
            notes.append(f"torn bytes before record(s) {', '.join(map(str, torn_at[:10]))} "
                         "(a full disk before cut-back existed)")  # fmt: skip
        return VerifyResult(True, count, 0, "; ".join(notes), repairs + len(torn_at))

    def _problem(
        self, record: dict[str, Any], line_no: int, prev: str, line: bytes, *, torn: bool
    ) -> str | None:
        """What is wrong with one record of a known format, or None."""
        if record.get("seq") != line_no:
            found = record.get("seq")
            return f"expected seq {line_no}, found {found!r} (deleted, reordered, inserted)"
        if not _same_mac(record.get("mac"), self._mac(record)):
            return "record altered (MAC mismatch)"
        # The MAC covers the parsed record: other bytes that parse to it (a key given twice,
        # the last kept here, the first read by grep or another parser) verified. Every
        # version wrote canonical(record); torn bytes of an old full disk may precede it.
        written = canonical(record) + b"\n"
        if line != written and not (torn and line.endswith(written)):
            return "record altered (not as written: other bytes parse to its fields)"
        if record.get("prev") != prev:
            return "chain broken (prev does not match)"
        return None

    def _unknown_format(self, record: dict[str, Any], count: int, line_no: int) -> VerifyResult:
        """Verify stops at a record of a format this version does not know: the records after
        it chain through a MAC it cannot check, so none of them is vouched for. A record of
        version 1 whose number was changed is tampering: its MAC is still version 1's."""
        found = audit_format.version(record)
        mac = record.get("mac")
        body = {k: v for k, v in record.items() if k != audit_format.FIELD}
        for was in ({}, {audit_format.FIELD: audit_format.ABSENT}):
            if _same_mac(mac, self._mac({**body, **was})):
                problem = f"record altered (its format version changed from 1 to {found!r})"
                return VerifyResult(False, count, line_no, problem)
        problem = (f"{audit_format.UNKNOWN} {found!r}, this ironclawd knows version "
                   f"{audit_format.known_text()} (written by a newer ironclawd, or altered if "
                   f"none has written to this log); {count} records before it verified, none "
                   "from it on")  # fmt: skip
        return VerifyResult(False, count, line_no, problem)

    def _check_end(
        self, count: int, prev: str, expected_head: tuple[int, str] | None
    ) -> VerifyResult | None:
        """The end of the file: no bytes after the last whole record, nothing cut off before
        the head remembered elsewhere."""
        with self._lock:  # not while a record is half-copied into the file
            tail = os.stat(self._path).st_size - self._whole_size()
        if tail > 0:
            problem = (f"{tail} bytes after the last whole record (a cut mid-record, or a "
                       "torn write not yet cut back)")  # fmt: skip
            return VerifyResult(False, count, count + 1, problem)
        if expected_head is not None and expected_head[0] > count:
            return VerifyResult(
                False, count, count + 1, f"log truncated: {expected_head[0]} records were written"
            )
        if expected_head is not None and expected_head[0] == count and expected_head[1] != prev:
            return VerifyResult(False, count, count, "last record differs from the remembered one")
        return None

    def read(self, after: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        out = []
        for record in self._records():
            if int(record.get("seq", 0)) > after:
                out.append(record)
                if len(out) >= limit:
                    break
        return out

    def close(self) -> None:
        os.close(self._fd)


def _parse(line: bytes) -> tuple[dict[str, Any], bool]:
    """A line as a record, and whether it had torn bytes before it: a line that does not
    parse is taken as the last whole record it ends with, if any ({} if none)."""
    try:
        record = json.loads(line)
        return (record if isinstance(record, dict) else {}), False
    except ValueError:
        pass
    start = line.find(b'{"', 1)
    while start > 0:
        try:
            record = json.loads(line[start:])
        except ValueError:
            start = line.find(b'{"', start + 1)
            continue
        return (record, True) if isinstance(record, dict) else ({}, False)
    return {}, False


def _set_flag(fd: int, on: bool) -> None:
    buf = fcntl.ioctl(fd, FS_IOC_GETFLAGS, struct.pack("i", 0))
    flags = struct.unpack("i", buf)[0]
    flags = flags | FS_APPEND_FL if on else flags & ~FS_APPEND_FL
    fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("i", flags))


def _set_append_only(fd: int) -> bool:
    """Set FS_APPEND_FL (ioctl_iflags(2)); False where the filesystem has no such flag."""
    try:
        buf = fcntl.ioctl(fd, FS_IOC_GETFLAGS, struct.pack("i", 0))
        flags = struct.unpack("i", buf)[0]
        if not flags & FS_APPEND_FL:
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("i", flags | FS_APPEND_FL))
    except OSError:
        return False
    return True


def _same_mac(stored: object, computed: str) -> bool:
    """Whether a record's stored ``mac`` is ``computed`` (hex), in constant time. Anything but
    a string of ASCII is a mismatch: ``compare_digest`` raises TypeError on a str holding
    non-ASCII characters, and a lone surrogate (JSON's ``\\ud800``) cannot be encoded, so an
    altered record must not reach either as text."""
    if not isinstance(stored, str) or not stored.isascii():
        return False
    return hmac.compare_digest(stored.encode(), computed.encode())
