"""The audit log: append-only, hash-chained, keyed, fsync'd (docs/architecture.md §7).

One JSON object per line. Each record carries ``prev`` (the previous record's ``mac``) and its
own ``mac`` = HMAC-SHA256 over the canonical JSON of everything else, under a key derived from
the master key — so rewriting history needs the key, not just a text editor and sha256sum. The
file is opened O_APPEND and, where the filesystem supports it, carries the kernel's append-only
flag (FS_APPEND_FL, chattr +a): even root must drop CAP_LINUX_IMMUTABLE-guarded flag first.
The newest (seq, mac) is also kept in the state DB, so a truncated tail is detected too.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ironclawd.errors import HostError

GENESIS = "0" * 64
FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_APPEND_FL = 0x00000020
MAX_RECORD = 64 * 1024


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    records: int
    first_bad: int = 0  # seq (1-based line number) of the first bad record
    problem: str = ""


def canonical(record: Mapping[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


class AuditLog:
    def __init__(self, path: Path, key: bytes) -> None:
        self._path = path
        self._key = key
        self._lock = threading.Lock()
        self.append_only = False
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._fd = os.open(
                path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
        except OSError as exc:
            raise HostError(f"opening audit log {path}: {exc.strerror}") from exc
        self.append_only = _set_append_only(self._fd)
        self._seq, self._prev = self._tail()

    def _tail(self) -> tuple[int, str]:
        seq, prev = 0, GENESIS
        for record in self._records():
            seq, prev = int(record.get("seq", 0)), str(record.get("mac", GENESIS))
        return seq, prev

    def _records(self) -> Iterator[dict[str, Any]]:
        with open(self._path, "rb") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    record = {}
                yield record if isinstance(record, dict) else {}

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
        """Append one record; with ``sync`` (the default) fsync it before returning."""
        with self._lock:
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
            try:
                os.write(self._fd, line)
                if sync:
                    os.fsync(self._fd)
            except OSError as exc:
                raise HostError(f"appending to audit log {self._path}: {exc.strerror}") from exc
            self._seq, self._prev = record["seq"], record["mac"]
            return record

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
        the head remembered elsewhere (catches truncation of the last records)."""
        prev, count = GENESIS, 0
        for line_no, record in enumerate(self._records(), start=1):
            if record.get("seq") != line_no:
                found = record.get("seq")
                problem = f"expected seq {line_no}, found {found!r} (deleted, reordered, inserted)"
                return VerifyResult(False, count, line_no, problem)
            if not hmac.compare_digest(str(record.get("mac", "")), self._mac(record)):
                return VerifyResult(False, count, line_no, "record altered (MAC mismatch)")
            if record.get("prev") != prev:
                return VerifyResult(False, count, line_no, "chain broken (prev does not match)")
            prev = str(record["mac"])
            count += 1
        if expected_head is not None and expected_head[0] > count:
            return VerifyResult(
                False, count, count + 1, f"log truncated: {expected_head[0]} records were written"
            )
        if expected_head is not None and expected_head[0] == count and expected_head[1] != prev:
            return VerifyResult(False, count, count, "last record differs from the remembered one")
        return VerifyResult(True, count)

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
