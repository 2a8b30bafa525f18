"""``ports.ChannelRecords`` in the state DB (tables of migration 4 in store/state.py): one
connection, one lock, synchronous=FULL, so what a call stored is on disk when it returns."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from ironclawd.errors import NotFound
from ironclawd.ports.channel_records import (
    ChannelMessage,
    Delivery,
    HeldMessage,
    Receiving,
)
from ironclawd.store.state import StateStore

# Interpolated into SQL text below: constants, never input.
_RECEIVING = "channel, event_id, sid, client_id, where_, thread, sender, text, reply_url"
_MESSAGE = "sid, seq, channel, where_, thread, event_id, sender, reply_url"
_HELD = "id, channel, where_, sender, event_id, thread, text, mentioned, received_at"
_DELIVERY = "sid, reply_seq, channel, state, attempts, next_at, last_error, updated_at"


class ChannelState:
    def __init__(self, state: StateStore) -> None:
        self._state = state

    @contextlib.contextmanager
    def _tx(self, doing: str) -> Iterator[Any]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT, rolled back on any error)."""
        with self._state.shared(doing) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _one(self, doing: str, sql: str, args: tuple[object, ...]) -> Any:
        with self._state.shared(doing) as db:
            return db.execute(sql, args).fetchone()

    def _all(self, doing: str, sql: str, args: tuple[object, ...] = ()) -> list[Any]:
        with self._state.shared(doing) as db:
            return list(db.execute(sql, args).fetchall())

    # -- cursors and sessions --------------------------------------------------------------

    def cursor(self, channel: str) -> str | None:
        row = self._one(
            f"reading the cursor of channel {channel}",
            "SELECT cursor FROM channel_cursors WHERE channel = ?",
            (channel,),
        )
        return str(row[0]) if row else None

    def save_cursor(self, channel: str, cursor: str) -> None:
        with self._state.shared(f"saving the cursor of channel {channel}") as db:
            db.execute(
                "INSERT OR REPLACE INTO channel_cursors (channel, cursor) VALUES (?, ?)",
                (channel, cursor),
            )

    def channel_session(self, channel: str, where: str, key: str) -> str | None:
        row = self._one(
            f"reading a session of channel {channel}",
            "SELECT sid FROM channel_sessions WHERE channel = ? AND where_ = ? AND key = ?",
            (channel, where, key),
        )
        return str(row[0]) if row else None

    def channel_sessions(self, channel: str, where: str) -> list[str]:
        with self._state.shared(f"reading the sessions of channel {channel}") as db:
            rows = db.execute(
                "SELECT sid FROM channel_sessions WHERE channel = ? AND where_ = ? ORDER BY key",
                (channel, where),
            ).fetchall()
        return [str(row[0]) for row in rows]

    def set_channel_session(self, channel: str, where: str, key: str, sid: str) -> None:
        with self._state.shared(f"storing a session of channel {channel}") as db:
            db.execute(
                "INSERT OR REPLACE INTO channel_sessions (channel, where_, key, sid) "
                "VALUES (?, ?, ?, ?)",
                (channel, where, key, sid),
            )

    # -- receiving and messages ------------------------------------------------------------

    def begin_receive(self, receiving: Receiving) -> Receiving:
        doing = f"receiving event of channel {receiving.channel}"
        with self._tx(doing) as db:
            db.execute(
                f"INSERT OR IGNORE INTO channel_receiving ({_RECEIVING}) "  # noqa: S608
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    receiving.channel, receiving.event_id, receiving.sid, receiving.client_id,
                    receiving.where, receiving.thread, receiving.sender, receiving.text,
                    receiving.reply_url,
                ),
            )  # fmt: skip
            row = db.execute(
                f"SELECT {_RECEIVING} FROM channel_receiving "  # noqa: S608
                "WHERE channel = ? AND event_id = ?",
                (receiving.channel, receiving.event_id),
            ).fetchone()
        return Receiving(*row)

    def receiving(self) -> list[Receiving]:
        rows = self._all(
            "listing receives in flight",
            f"SELECT {_RECEIVING} FROM channel_receiving ORDER BY rowid",  # noqa: S608
        )
        return [Receiving(*r) for r in rows]

    def has_receiving(self, sid: str) -> bool:
        row = self._one(
            f"looking for receives of session {sid}",
            "SELECT 1 FROM channel_receiving WHERE sid = ? LIMIT 1",
            (sid,),
        )
        return row is not None

    def complete_receive(self, message: ChannelMessage) -> None:
        m = message
        with self._tx(f"keeping message {m.seq} of session {m.sid}") as db:
            db.execute(
                f"INSERT OR IGNORE INTO channel_messages ({_MESSAGE}) "  # noqa: S608
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (m.sid, m.seq, m.channel, m.where, m.thread, m.event_id, m.sender, m.reply_url),
            )
            db.execute(
                "DELETE FROM channel_receiving WHERE channel = ? AND event_id = ?",
                (m.channel, m.event_id),
            )

    def forget_receive(self, channel: str, event_id: str) -> None:
        with self._state.shared(f"forgetting a receive of channel {channel}") as db:
            db.execute(
                "DELETE FROM channel_receiving WHERE channel = ? AND event_id = ?",
                (channel, event_id),
            )

    def message(self, sid: str, seq: int) -> ChannelMessage | None:
        row = self._one(
            f"reading message {seq} of session {sid}",
            f"SELECT {_MESSAGE} FROM channel_messages WHERE sid = ? AND seq = ?",  # noqa: S608
            (sid, seq),
        )
        return ChannelMessage(*row) if row else None

    def message_by_event(self, channel: str, event_id: str) -> ChannelMessage | None:
        """The message of the event; for one of a removed session (kept in
        ``channel_events_gone``, store/state.py), its session and seq only."""
        doing = f"looking up an event of channel {channel}"
        row = self._one(
            doing,
            f"SELECT {_MESSAGE} FROM channel_messages "  # noqa: S608
            "WHERE channel = ? AND event_id = ?",
            (channel, event_id),
        )
        if row:
            return ChannelMessage(*row)
        gone = self._one(
            doing,
            "SELECT sid, seq FROM channel_events_gone WHERE channel = ? AND event_id = ?",
            (channel, event_id),
        )
        return (
            ChannelMessage(str(gone[0]), int(gone[1]), channel, "", "", event_id, "")
            if gone
            else None
        )

    def channel_sids(self) -> list[str]:
        rows = self._all(
            "listing channel sessions", "SELECT DISTINCT sid FROM channel_messages ORDER BY sid"
        )
        return [str(r[0]) for r in rows]

    # -- held ------------------------------------------------------------------------------

    def hold(self, held: HeldMessage, max_rows: int, max_bytes: int) -> HeldMessage | None:
        h = held
        size = len(h.text.encode("utf-8", "surrogatepass"))
        with self._tx(f"holding an event of channel {h.channel}") as db:
            row = db.execute(
                f"SELECT {_HELD} FROM held WHERE channel = ? AND event_id = ?",  # noqa: S608
                (h.channel, h.event_id),
            ).fetchone()
            if row is not None:
                return _held(row)
            # From the index held_by_channel alone (store/state.py migration 8).
            count, total = db.execute(
                "SELECT count(*), total(size) FROM held WHERE channel = ?", (h.channel,)
            ).fetchone()
            if count >= max_rows or total + size > max_bytes:
                return None
            cursor = db.execute(
                "INSERT INTO held (channel, where_, sender, event_id, thread, text, mentioned, "
                "received_at, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (h.channel, h.where, h.sender, h.event_id, h.thread, h.text, int(h.mentioned),
                 h.received_at, size),
            )  # fmt: skip
        return replace(h, id=int(cursor.lastrowid))

    def held(self, after: int = 0, limit: int = -1) -> list[HeldMessage]:
        rows = self._all(
            "listing held messages",
            f"SELECT {_HELD} FROM held WHERE id > ? ORDER BY id LIMIT ?",  # noqa: S608
            (after, limit),
        )
        return [_held(r) for r in rows]

    def held_count(self, channel: str) -> int:
        row = self._one(
            f"counting held messages of channel {channel}",
            "SELECT count(*) FROM held WHERE channel = ?",
            (channel,),
        )
        return int(row[0])

    def get_held(self, held_id: int) -> HeldMessage:
        row = self._one(
            f"reading held message {held_id}",
            f"SELECT {_HELD} FROM held WHERE id = ?",  # noqa: S608
            (held_id,),
        )
        if row is None:
            raise NotFound(f"held message {held_id} not found (see: ironctl channel held)")
        return _held(row)

    def delete_held(self, held_id: int) -> None:
        with self._state.shared(f"deleting held message {held_id}") as db:
            db.execute("DELETE FROM held WHERE id = ?", (held_id,))

    # -- deliveries ------------------------------------------------------------------------

    def add_delivery(self, delivery: Delivery) -> Delivery:
        d = delivery
        with self._tx(f"adding delivery {d.sid}-{d.reply_seq}") as db:
            db.execute(
                f"INSERT OR IGNORE INTO deliveries ({_DELIVERY}) "  # noqa: S608
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                _delivery_row(d),
            )
            row = db.execute(
                f"SELECT {_DELIVERY} FROM deliveries "  # noqa: S608
                "WHERE sid = ? AND reply_seq = ?",
                (d.sid, d.reply_seq),
            ).fetchone()
        return _delivery(row)

    def save_delivery(self, delivery: Delivery) -> None:
        d = delivery
        with self._state.shared(f"saving delivery {d.sid}-{d.reply_seq}") as db:
            db.execute(
                "UPDATE deliveries SET state = ?, attempts = ?, next_at = ?, last_error = ?, "
                "updated_at = ? WHERE sid = ? AND reply_seq = ?",
                (d.state, d.attempts, d.next_at, d.last_error, d.updated_at, d.sid, d.reply_seq),
            )

    def last_settled(self, sid: str) -> int:
        row = self._one(
            f"reading deliveries of session {sid}",
            "SELECT max(reply_seq) FROM deliveries WHERE sid = ?",
            (sid,),
        )
        return int(row[0]) if row and row[0] is not None else 0

    def pending_deliveries(self, sid: str) -> list[Delivery]:
        rows = self._all(
            f"reading pending deliveries of session {sid}",
            f"SELECT {_DELIVERY} FROM deliveries "  # noqa: S608
            "WHERE sid = ? AND state = 'pending' ORDER BY reply_seq",
            (sid,),
        )
        return [_delivery(r) for r in rows]

    def delivery_counts(self, channel: str) -> dict[str, int]:
        rows = self._all(
            f"counting deliveries of channel {channel}",
            "SELECT state, count(*) FROM deliveries WHERE channel = ? GROUP BY state",
            (channel,),
        )
        return {str(s): int(n) for s, n in rows}

    def failed_deliveries(self, channel: str, limit: int) -> list[Delivery]:
        rows = self._all(
            f"reading failed deliveries of channel {channel}",
            f"SELECT {_DELIVERY} FROM deliveries WHERE channel = ? AND (state = 'failed' OR "  # noqa: S608
            "(state = 'pending' AND last_error != '')) ORDER BY updated_at DESC LIMIT ?",
            (channel, limit),
        )
        return [_delivery(r) for r in rows]


def _held(row: tuple[Any, ...]) -> HeldMessage:
    hid, channel, where, sender, event_id, thread, text, mentioned, received_at = row
    return HeldMessage(
        int(hid), str(channel), str(where), str(sender), str(event_id), str(thread), str(text),
        bool(mentioned), float(received_at),
    )  # fmt: skip


def _delivery_row(d: Delivery) -> tuple[object, ...]:
    return (d.sid, d.reply_seq, d.channel, d.state, d.attempts, d.next_at, d.last_error,
            d.updated_at)  # fmt: skip


def _delivery(row: tuple[Any, ...]) -> Delivery:
    sid, seq, channel, state, attempts, next_at, error, updated = row
    return Delivery(
        str(sid), int(seq), str(channel), str(state), int(attempts), float(next_at), str(error),
        float(updated),
    )  # fmt: skip


__all__ = ["ChannelState"]
