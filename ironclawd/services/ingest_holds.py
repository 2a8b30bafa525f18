"""Sessions whose ingestion is held at one of their bounds (domain/reply_bounds.py).

A row that would cross a bound, or answers no message sent, is not ingested: it and the rows
after it wait in the session's outbound queue, on the session's own tmpfs, until the bound is
raised (a reload applies ``[queues]`` max_rows, max_ingested_bytes and
max_replies_per_message) or the session is removed. Other sessions go on as before.

An episode is ingestion held at one seq; it ends when replies are taken again, so a box cannot
start episodes at will (each needs replies taken, which its bounds bound). Each episode is
logged once with its message id (REPLIES_HELD: units/ironclaw.catalog says what to do) and
audited once (``outbound.held``); each time ingestion finds the session still held, the journal
says so at a bounded rate (ratelog.py). For as long as it lasts, the session's error says why
and what to do (``ironctl session show``, ``session list``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from ironclawd import ratelog
from ironclawd.domain.message_ids import MessageId, message_id

log = logging.getLogger("ironclawd.messages")

_BOUND = re.compile(r"\[queues\] (\w+)")


@dataclass(frozen=True)
class Hold:
    seq: int  # the first row not taken
    reason: str


def what_to_do(sid: str, reason: str) -> str:
    """The operator's way out of a hold for ``reason``."""
    bound = _BOUND.search(reason)
    if bound is not None:
        return (
            f"raise [queues] {bound.group(1)} and run systemctl reload ironclawd, or remove "
            f"the session (ironctl session rm --force {sid})"
        )
    return (
        "its agent does not answer the messages sent to it as the shipped agent does: remove "
        f"the session (ironctl session rm --force {sid})"
    )


class IngestHolds:
    """``record(key, event, actor, **fields)``: an audit record that never raises (the message
    service's own, which logs a record the audit log could not take)."""

    def __init__(self, record: Callable[..., None]) -> None:
        self._record = record
        self._held: dict[str, Hold] = {}

    def hold(self, sid: str, seq: int, reason: str) -> None:
        """Ingestion of ``sid`` stopped before row ``seq``, for ``reason``."""
        held = self._held.get(sid)
        if held is not None and held.seq == seq:
            self._held[sid] = Hold(seq, reason)  # a reload may have changed which bound it is
            ratelog.warning(log, sid, "ingest held", "session %s: replies still held in its "
                            "outbound queue from seq %d: %s", sid, seq, reason)  # fmt: skip
            return
        self._held[sid] = Hold(seq, reason)
        log.warning(
            "session %s: replies held in its outbound queue from seq %d: %s; %s",
            sid, seq, reason, what_to_do(sid, reason),
            extra=message_id(MessageId.REPLIES_HELD, IRONCLAW_SID=sid),
        )  # fmt: skip
        self._record(f"{sid}/held", "outbound.held", f"session:{sid}", sid=sid, reply_seq=seq,
                     reason=reason[:300])  # fmt: skip

    def near(self, sid: str, what: str) -> None:
        """``what`` (domain/reply_bounds.py ``nearing``; "" for nothing): the session's replies
        near a lifetime bound, at which ingestion will hold. Logged once per crossing, with its
        own message id, and audited."""
        if not what:
            return
        log.warning(
            "session %s: %s; ingestion holds at the bound (nothing is lost): before then, %s",
            sid, what, what_to_do(sid, what),
            extra=message_id(MessageId.REPLIES_NEAR_BOUND, IRONCLAW_SID=sid),
        )  # fmt: skip
        self._record(f"{sid}/near", "outbound.near_bound", f"session:{sid}", sid=sid,
                     reason=what[:300])  # fmt: skip

    def taken(self, sid: str) -> None:
        """Replies of ``sid`` were ingested: a hold it was in is over."""
        held = self._held.pop(sid, None)
        if held is not None:
            log.info("session %s: replies are taken again from seq %d", sid, held.seq)

    def why(self, sid: str) -> str:
        """What the session's error shows while it is held ("" when it is not)."""
        held = self._held.get(sid)
        if held is None:
            return ""
        return (
            f"replies held in its outbound queue from seq {held.seq}: {held.reason}; "
            f"{what_to_do(sid, held.reason)}"
        )

    def at(self, sid: str) -> int | None:
        """The first row not taken of a held session (None: not held)."""
        held = self._held.get(sid)
        return None if held is None else held.seq

    def held(self) -> list[str]:
        return list(self._held)

    def forget(self, sid: str) -> None:
        self._held.pop(sid, None)
