"""Logging: structured records to journald under systemd, plain lines on stderr otherwise."""

from __future__ import annotations

import copy
import logging
import os
import sys
import time
from collections.abc import Callable

from systemd.journal import JournalHandler

# Libraries whose INFO lines repeat what the daemon records itself, with more than it records.
# httpx and httpx2 log each request their clients make as "HTTP Request: POST <url> ...": a
# second journal line for every model call (the model proxy logs its own, without the URL), and
# a remote MCP server's whole URL, query included. The mcp SDK logs a remote server's session id.
# (The egress broker and webhook delivery use httpx's transport alone, which logs nothing.) The
# journal is readable by the adm and systemd-journal groups, not only by root. Held at WARNING
# whatever the daemon's level.
QUIET_LIBRARIES = ("httpx", "httpx2", "httpcore", "httpcore2", "mcp", "client")

# Loggers that write what a remote party chose, at its pace: the MCP SDK logs a WARNING with a
# traceback quoting the value for each notification a server sends that does not validate (its
# client session logs as "client", outside "mcp"). 5,000 such lines from one server became 5,000
# journal entries with 5.8 MB of tracebacks, and journald's per-unit limit then dropped the
# daemon's own lines (found by a review). At most METERED_PER_MINUTE of them a minute, without
# tracebacks; the next after a full minute says how many were left out.
METERED_LIBRARIES = ("mcp", "client")
METERED_PER_MINUTE = 20

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class _Journal(JournalHandler):  # type: ignore[misc]
    """systemd-python's handler, but each line's arguments go to the journal only as part of
    its MESSAGE: the handler also sent ``CODE_ARGS=str(record.args)``, a second, unclipped copy
    of every argument, which undid the clipping of values a sandbox chose (``%.200r``) and put
    whole values in a field nobody reads (found by a review)."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.args:
            try:
                message = record.getMessage()
            except Exception:  # a bad format: the handler reports it (handleError), as ever
                message = None
            if message is not None:
                record = copy.copy(record)
                record.msg, record.args = message, None
        super().emit(record)


class Metered(logging.Filter):
    """Pass at most ``per_minute`` records a minute from METERED_LIBRARIES' loggers (their
    children too), each without its traceback; the rest pass untouched."""

    def __init__(
        self, per_minute: int = METERED_PER_MINUTE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self._per_minute = per_minute
        self._clock = clock
        self._window = float("-inf")
        self._passed = 0
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        root = record.name.partition(".")[0]
        if root not in METERED_LIBRARIES:
            return True
        now = self._clock()
        if now - self._window >= 60:
            self._window, self._passed = now, 0
        if self._passed >= self._per_minute:
            self._dropped += 1
            return False
        self._passed += 1
        try:
            message = record.getMessage()
        except Exception:  # a bad format: the handler reports it, as ever
            return True
        if record.exc_info and record.exc_info[1] is not None:
            message += f" ({type(record.exc_info[1]).__name__}; traceback not logged)"
        if self._dropped:
            message += f" [{self._dropped} such lines left out before this one]"
            self._dropped = 0
        record.msg, record.args = message, None
        record.exc_info, record.exc_text = None, None
        return True


def setup_logging(level: str) -> None:
    """Send records to the journal (with extra fields such as IRONCLAW_CALLER_UID) when the
    process runs under systemd, else to stderr."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID"):
        handler = _Journal(SYSLOG_IDENTIFIER="ironclawd")
    else:
        handler.setFormatter(logging.Formatter("ironclawd: %(levelname)s %(message)s"))
    handler.addFilter(Metered())
    root.addHandler(handler)
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)
    set_level(level)


def set_level(level: str) -> None:
    logging.getLogger().setLevel(LEVELS[level])
