"""What the Matrix adapter (host/matrix.py) reads from a homeserver, as typed values: nio's sync
answer narrowed to what is used, and one timeline event (hostile JSON: every field is checked
for its type and length here, nothing is trusted for being there) turned into an
``InboundEvent`` or the name of the reason it is not one. Also the adapter's rate meter.

matrix-nio ships no type information; everything it returns is read here, field by field, into
the values below, so the rest of the adapter is checked by mypy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ironclawd.ports.channels import InboundEvent

# The Matrix spec caps user, room and event ids at 255 bytes; anything longer is not one.
MAX_ID = 255

# Why an event of a joined room's timeline is not handed to the inbox (status() counters).
OWN = "own"  # the bot's own message: never inbound (no reply loops)
OTHER = "ignored"  # not a plain-text message: state, notices (bots), emotes, files, encrypted…
EDIT = "edits_ignored"  # an m.replace edit: the original was the message
MALFORMED = "malformed"  # fields of the wrong type or length
OVERSIZED = "oversized"  # body over max_message_bytes


@dataclass(frozen=True)
class RoomTimeline:
    """One joined room's new events in a sync answer, oldest first."""

    room_id: str
    events: tuple[Mapping[str, object], ...]  # the events' raw JSON
    limited: bool  # the server left out events between the last sync and these
    prev_batch: str  # where to page back from to fetch those ("" if not given)


@dataclass(frozen=True)
class SyncBatch:
    next_batch: str
    joined: tuple[RoomTimeline, ...]
    invited: frozenset[str]  # rooms the bot is invited to (and not yet in)
    left: frozenset[str]  # rooms the bot left or was removed from


def _source(event: Any) -> Mapping[str, object]:
    src = getattr(event, "source", None)
    return src if isinstance(src, dict) else {}


def sync_batch(response: Any) -> SyncBatch:
    """A successful ``nio.SyncResponse`` narrowed to what the adapter uses."""
    rooms = response.rooms
    joined = []
    for room_id, info in rooms.join.items():
        timeline = info.timeline
        joined.append(
            RoomTimeline(
                room_id=str(room_id),
                events=tuple(_source(e) for e in timeline.events),
                limited=bool(timeline.limited),
                prev_batch=str(timeline.prev_batch or ""),
            )
        )
    return SyncBatch(
        next_batch=str(response.next_batch),
        joined=tuple(joined),
        invited=frozenset(str(r) for r in rooms.invite),
        left=frozenset(str(r) for r in rooms.leave),
    )


def page_events(response: Any) -> tuple[tuple[Mapping[str, object], ...], str]:
    """A ``nio.RoomMessagesResponse``: its events in the order given and the token after them
    ("" when the server has no more)."""
    return tuple(_source(e) for e in response.chunk), str(response.end or "")


def joined_by(events: Sequence[Mapping[str, object]], user_id: str) -> int | None:
    """The index of ``user_id``'s own join in ``events`` (the room was joined in this batch).
    A member event of one already joined (a new display name or avatar) says "join" too: it
    is not a join, and the messages before it are not dropped for one."""
    for i, ev in enumerate(events):
        content = ev.get("content")
        unsigned = ev.get("unsigned")
        before = unsigned.get("prev_content") if isinstance(unsigned, dict) else None
        if (
            ev.get("type") == "m.room.member"
            and ev.get("state_key") == user_id
            and isinstance(content, dict)
            and content.get("membership") == "join"
            and not (isinstance(before, dict) and before.get("membership") == "join")
        ):
            return i
    return None


def _id(value: object) -> str | None:
    """An id of 1-MAX_ID bytes of UTF-8; None for anything else, a lone surrogate included
    (JSON can carry one; the state DB could not store it, and the channel's sync retried the
    batch holding it for ever)."""
    if not isinstance(value, str):
        return None
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return None
    return value if 0 < size <= MAX_ID else None


def _envelope(source: Mapping[str, object], me: str) -> tuple[str, str, dict[str, object]] | str:
    if source.get("type") != "m.room.message":
        return OTHER
    sender, event_id = _id(source.get("sender")), _id(source.get("event_id"))
    content = source.get("content")
    if sender is None or event_id is None or not isinstance(content, dict):
        return MALFORMED
    return OWN if sender == me else (sender, event_id, content)


@dataclass(frozen=True)
class Reader:
    """Reads one channel's timeline events as the bot ``me`` (display names ``names``)."""

    channel: str
    me: str
    names: tuple[str, ...]
    max_bytes: int

    def read(self, room_id: str, source: Mapping[str, object], now: float) -> InboundEvent | str:
        """The message ``source`` carries, or why it is not handed on (OWN, OTHER, EDIT,
        MALFORMED, OVERSIZED). Only ``content.body`` is read: ``formatted_body`` (HTML) never
        reaches an agent."""
        envelope = _envelope(source, self.me)
        if isinstance(envelope, str):
            return envelope
        sender, event_id, content = envelope
        relates = content.get("m.relates_to")
        relates = relates if isinstance(relates, dict) else {}
        body = content.get("body")
        if content.get("msgtype") != "m.text":
            return OTHER
        if relates.get("rel_type") == "m.replace":
            return EDIT
        thread = _id(relates.get("event_id")) if relates.get("rel_type") == "m.thread" else ""
        if not isinstance(body, str) or thread is None:
            return MALFORMED
        # JSON may carry lone surrogates: count them as their bytes, the inbox's checks judge them.
        if len(body.encode("utf-8", "surrogatepass")) > self.max_bytes:
            return OVERSIZED
        return InboundEvent(
            channel=self.channel,
            event_id=event_id,
            sender=sender,
            where=room_id,
            text=body,
            thread=thread,
            mentioned=_mentions(content, body, self.me, self.names),
            received_at=now,
        )


def _mentions(content: Mapping[str, object], body: str, me: str, names: Sequence[str]) -> bool:
    mentions = content.get("m.mentions")
    if isinstance(mentions, dict):
        ids = mentions.get("user_ids")
        if isinstance(ids, list) and me in ids:
            return True
    folded = body.casefold()
    return any(n and n.casefold() in folded for n in (me, *names))


class Meter:
    """Token buckets by key: ``per_minute`` events a minute, bursts up to ``per_minute``. At most
    MAX_KEYS buckets: past that, full ones are forgotten and, if most are still busy, the
    longest-held half (many senders already evade a per-sender limit; the channel-wide meter
    still holds them). Amortised O(1) per event, whatever the senders do."""

    MAX_KEYS = 4096

    def __init__(self, per_minute: int, clock: Callable[[], float]) -> None:
        self._rate = per_minute / 60.0
        self._burst = float(per_minute)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)

    def take(self, key: str) -> bool:
        """Spend one token of ``key``'s bucket if there is one; whether there was."""
        now = self._clock()
        if key not in self._buckets and len(self._buckets) >= self.MAX_KEYS:
            self._shrink(now)
        tokens, at = self._buckets.get(key, (self._burst, now))
        tokens = min(self._burst, tokens + (now - at) * self._rate)
        if tokens < 1:
            self._buckets[key] = (tokens, now)
            return False
        self._buckets[key] = (tokens - 1, now)
        return True

    def _shrink(self, now: float) -> None:
        for key, (tokens, at) in list(self._buckets.items()):
            if tokens + (now - at) * self._rate >= self._burst:
                del self._buckets[key]
        if len(self._buckets) > self.MAX_KEYS // 2:
            for key in list(self._buckets)[: len(self._buckets) - self.MAX_KEYS // 2]:
                del self._buckets[key]
