"""systemd-python's ``JournalHandler`` also sent ``CODE_ARGS=str(record.args)``: a second, whole
copy of every argument beside MESSAGE, which undid the clipping of values a sandbox chose (a
gRPC method name logged with ``%.200r`` came back in full, 6,000 characters; found by a
review). The daemon's handler sends the arguments only within MESSAGE."""

from __future__ import annotations

import logging
from typing import Any

from ironclawd.logsetup import _Journal


def _sent(*args: Any) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    handler = _Journal(
        SYSLOG_IDENTIFIER="ironclawd",
        sender_function=lambda text, /, **fields: sent.append({**fields, "MESSAGE": text}),
    )
    log = logging.getLogger("test-journal-handler")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        log.warning(*args, extra={"IRONCLAW_SID": "s1"})
    finally:
        log.removeHandler(handler)
    return sent


def test_arguments_reach_the_journal_only_within_the_message() -> None:
    method = "/x." + "A" * 6000  # a gRPC :path a box chose
    (entry,) = _sent("refused %.200r", method)
    assert "CODE_ARGS" not in entry
    assert len(entry["MESSAGE"]) < 220
    assert not any(method in str(value) for value in entry.values())
    assert entry["IRONCLAW_SID"] == "s1"


def test_a_line_whose_format_does_not_fit_is_reported_not_raised() -> None:
    # As the library's handler does: handleError, never an exception into the caller.
    raised = logging.raiseExceptions
    logging.raiseExceptions = False
    try:
        assert _sent("two %s %s", "one") == []
    finally:
        logging.raiseExceptions = raised
