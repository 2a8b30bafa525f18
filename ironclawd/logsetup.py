"""Logging: structured records to journald under systemd, plain lines on stderr otherwise."""

from __future__ import annotations

import logging
import os
import sys

from systemd.journal import JournalHandler

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def setup_logging(level: str) -> None:
    """Send records to the journal (with extra fields such as IRONCLAW_CALLER_UID) when the
    process runs under systemd, else to stderr."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID"):
        handler = JournalHandler(SYSLOG_IDENTIFIER="ironclawd")
    else:
        handler.setFormatter(logging.Formatter("ironclawd: %(levelname)s %(message)s"))
    root.addHandler(handler)
    set_level(level)


def set_level(level: str) -> None:
    logging.getLogger().setLevel(LEVELS[level])
