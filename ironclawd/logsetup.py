"""Logging: structured records to journald under systemd, plain lines on stderr otherwise."""

from __future__ import annotations

import copy
import logging
import os
import sys

from systemd.journal import JournalHandler

# Libraries whose INFO lines repeat what the daemon records itself, with more than it records.
# httpx and httpx2 log each request their clients make as "HTTP Request: POST <url> ...": a
# second journal line for every model call (the model proxy logs its own, without the URL), and
# a remote MCP server's whole URL, query included. The mcp SDK logs a remote server's session id.
# (The egress broker and webhook delivery use httpx's transport alone, which logs nothing.) The
# journal is readable by the adm and systemd-journal groups, not only by root. Held at WARNING
# whatever the daemon's level.
QUIET_LIBRARIES = ("httpx", "httpx2", "httpcore", "httpcore2", "mcp")

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
    root.addHandler(handler)
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)
    set_level(level)


def set_level(level: str) -> None:
    logging.getLogger().setLevel(LEVELS[level])
