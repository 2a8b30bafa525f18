"""Read a sandbox unit's journal (systemd-python's Reader: sd-journal, no journalctl parsing)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from systemd import journal

from ironclawd.errors import HostError
from ironclawd.ports import LogLine

WAIT_SLICE = 0.5  # seconds between checks of the stop flag while following


def _open(unit: str) -> Any:
    try:
        reader = journal.Reader()
    except OSError as exc:
        raise HostError(f"opening the journal: {exc}") from exc
    # The unit's own output, or PID 1's messages about it.
    reader.add_match(_SYSTEMD_UNIT=unit)
    reader.add_disjunction()
    reader.add_match(UNIT=unit, _PID="1")
    return reader


def _line(entry: dict[str, Any]) -> LogLine:
    stamp = entry.get("__REALTIME_TIMESTAMP")
    ts = stamp.timestamp() if isinstance(stamp, datetime) else 0.0
    message = entry.get("MESSAGE", "")
    if isinstance(message, bytes):
        message = message.decode("utf-8", "replace")
    source = (
        "systemd" if str(entry.get("_PID", "")) == "1" else str(entry.get("SYSLOG_IDENTIFIER", ""))
    )
    return LogLine(ts, str(message), source)


def tail(unit: str, lines: int) -> list[LogLine]:
    """The last ``lines`` entries of ``unit``'s journal, oldest first."""
    reader = _open(unit)
    try:
        reader.seek_tail()
        entries = []
        for _ in range(lines):
            entry = reader.get_previous()
            if not entry:
                break
            entries.append(_line(entry))
        return list(reversed(entries))
    finally:
        reader.close()


def follow(unit: str, stop: threading.Event) -> Iterator[LogLine]:
    """New entries of ``unit``'s journal as they arrive (sd_journal_wait, inotify-driven),
    until ``stop`` is set."""
    reader = _open(unit)
    try:
        reader.seek_tail()
        reader.get_previous()
        while not stop.is_set():
            for entry in reader:
                yield _line(entry)
            reader.wait(WAIT_SLICE)
    finally:
        reader.close()


class SystemdJournal:
    """JournalReader over the local journal."""

    def tail(self, unit: str, lines: int) -> list[LogLine]:
        return tail(unit, lines)

    def follow(self, unit: str, stop: threading.Event) -> Iterator[LogLine]:
        return follow(unit, stop)
