"""Journal lines an untrusted party can cause, at a bounded rate.

Anything a sandbox can make the daemon log at will (a refused connection or call, a bad request,
a denied peer, a rate-limit hit, a row it wrote that cannot be ingested) goes through one
:class:`LogThrottle`, keyed by (session, kind): the first ``per_window`` lines of a kind in a
window are written as they come, the rest are counted, and one line "suppressed K similar
messages" says how many were left out once the window is over (on the next line of that key, or
at the latest on :meth:`LogThrottle.flush`, which the daemon calls every second). So a looping
box costs the journal at most ``per_window + 1`` lines per kind per window.

Top-level (like ``errors.py``) because every layer has such lines: ``api`` (sockets), ``services``
(ingestion, egress) and adapters (``store``) use the shared instance through :func:`warning`,
:func:`info` or :func:`error`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_PER_WINDOW = 10
DEFAULT_WINDOW_SECONDS = 60.0
# Keys remembered at once: a box can mint kinds only from the daemon's fixed strings and its own
# session id, but a bound keeps even a bug from growing this without limit.
MAX_KEYS = 4096


@dataclass
class _Window:
    start: float
    written: int
    suppressed: int
    logger: logging.Logger
    level: int


class LogThrottle:
    """At most ``per_window`` lines per key per ``window_seconds``, then one summary line."""

    def __init__(
        self,
        per_window: int = DEFAULT_PER_WINDOW,
        window_seconds: float = DEFAULT_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._per_window = per_window
        self._window = window_seconds
        self._clock = clock
        self._lock = threading.Lock()  # the ingestion and egress paths log from worker threads
        self._keys: OrderedDict[tuple[str, str], _Window] = OrderedDict()

    def configure(self, per_window: int, window_seconds: float) -> None:
        with self._lock:
            self._per_window, self._window = per_window, window_seconds

    def log(
        self,
        logger: logging.Logger,
        level: int,
        sid: str,
        kind: str,
        msg: str,
        *args: Any,
        extra: Mapping[str, Any] | None = None,
    ) -> bool:
        """Log ``msg % args`` unless (``sid``, ``kind``) is over its rate; whether it was."""
        now = self._clock()
        key = (sid, kind)
        with self._lock:
            window = self._keys.get(key)
            summary = None
            if window is not None and now - window.start >= self._window:
                summary = self._close(key, window)
                window = None
            if window is None:
                window = self._keys[key] = _Window(now, 0, 0, logger, level)
                while len(self._keys) > MAX_KEYS:
                    old_key, old = self._keys.popitem(last=False)
                    self._emit(self._close(old_key, old))
            self._keys.move_to_end(key)
            window.logger, window.level = logger, max(window.level, level)
            admitted = window.written < self._per_window
            if admitted:
                window.written += 1
            else:
                window.suppressed += 1
        self._emit(summary)
        if admitted:
            fields = {"IRONCLAW_SID": sid, "IRONCLAW_LOG_KIND": kind, **(extra or {})}
            logger.log(level, msg, *args, extra=fields)
        return admitted

    def flush(self) -> int:
        """Write the summary of every window that is over; how many summaries were written."""
        now = self._clock()
        with self._lock:
            done = [(k, w) for k, w in self._keys.items() if now - w.start >= self._window]
            summaries = [self._close(k, w) for k, w in done]
        for summary in summaries:
            self._emit(summary)
        return sum(1 for s in summaries if s is not None)

    def _close(self, key: tuple[str, str], window: _Window) -> tuple[_Window, str, str] | None:
        self._keys.pop(key, None)
        return (window, *key) if window.suppressed else None

    def _emit(self, summary: tuple[_Window, str, str] | None) -> None:
        if summary is None:
            return
        window, sid, kind = summary
        window.logger.log(
            window.level,
            "session %s: suppressed %d similar messages (%s) in %.0f s",
            sid,
            window.suppressed,
            kind,
            self._window,
            extra={
                "IRONCLAW_SID": sid,
                "IRONCLAW_LOG_KIND": kind,
                "IRONCLAW_SUPPRESSED": window.suppressed,
            },
        )


# The daemon's one throttle; daemon.py sets its rate from [daemon] agent_log_lines and
# agent_log_window_seconds.
AGENT_LOG = LogThrottle()


def warning(logger: logging.Logger, sid: str, kind: str, msg: str, *args: Any) -> bool:
    """``logger.warning`` through the shared throttle, keyed by session and kind."""
    return AGENT_LOG.log(logger, logging.WARNING, sid, kind, msg, *args)


def info(logger: logging.Logger, sid: str, kind: str, msg: str, *args: Any) -> bool:
    """``logger.info`` through the shared throttle, keyed by session and kind."""
    return AGENT_LOG.log(logger, logging.INFO, sid, kind, msg, *args)


def error(logger: logging.Logger, sid: str, kind: str, msg: str, *args: Any) -> bool:
    """``logger.error`` through the shared throttle, keyed by session and kind."""
    return AGENT_LOG.log(logger, logging.ERROR, sid, kind, msg, *args)
