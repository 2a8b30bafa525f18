"""The Matrix channel: a bot user of a homeserver, over matrix-nio (docs/channels.md).

The bot logs in with the access token of its credential (read at each use, so a rotated token is
picked up; never logged) and long-polls ``/sync``. Exactly once, from the homeserver's side:
- the sync token (the cursor) is saved through the inbox only after every message of the batch
  was handed to ``InboxSink.receive`` and it returned; a receive that raises stops its room's
  part of the batch (the other rooms go on: one room whose messages cannot be taken must not
  stop every other room of the bot) and the same ``since`` is synced again after a back-off (1 s
  doubling to 60 s), so nothing is skipped, and what was received before the failure comes
  again and is a DUPLICATE (the inbox holds a message whose receive keeps failing for an
  operator, and the batch then moves on); a full disk stops the whole batch at once;
- a timeline the server cut short (``limited``: more events than the filter's 100 since the last
  sync) is completed by paging back to the previous token before anything is handed on;
- with no saved cursor, the first sync only positions the channel: messages from before the
  channel existed are not answered; nor are those a room held before the bot joined it;
- replies are sent with the delivery id as the transaction id: the homeserver de-duplicates a
  resend of the same id by the same device (a reply delivered twice shows once).

Hostile input: only plain ``m.text`` bodies are read (never ``formatted_body``); bodies over
``max_message_bytes`` are dropped; senders and the whole channel are rate-limited (over the limit
is dropped: Matrix cannot be asked to resend); the bot's own messages are never inbound; it joins
only rooms some agent is wired to. End-to-end encryption is not supported: encrypted messages
are ignored (counted), and the bot should not be invited to encrypted rooms.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp
import nio

from ironclawd.domain.channels import ChannelConfig
from ironclawd.errors import ChannelFailed, DiskFull, IronclawError
from ironclawd.host import matrix_events as ev
from ironclawd.ports import Clock
from ironclawd.ports.channels import ChannelStatus, InboxSink, OutboundReply

log = logging.getLogger("ironclawd.channels.matrix")

SYNC_TIMEOUT_MS = 30_000  # the long poll; stop() cancels it
# While invited to rooms no agent is wired to, sync more often: a route approved for one of them
# (the inbox changes wiring; nothing tells the adapter) is joined within this time.
INVITED_SYNC_TIMEOUT_MS = 5_000
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 60.0
STOP_GRACE_SECONDS = 10.0
START_WAIT_SECONDS = 10.0
TIMELINE_LIMIT = 100  # events per room per sync before the server says `limited`
PAGE_LIMIT = 100
MAX_BACKFILL_PAGES = 50  # a gap of more than 5,000 events in one room is cut (counted)


def sync_filter(timeline_limit: int) -> dict[str, Any]:
    """The bot reads messages and its own membership: no presence, typing, receipts, account
    data; at most ``timeline_limit`` events per room per sync (more: the timeline is `limited`)."""
    none = {"not_types": ["*"]}
    return {
        "presence": none,
        "account_data": none,
        "room": {
            "timeline": {"limit": timeline_limit},
            "ephemeral": none,
            "account_data": none,
            "state": {"lazy_load_members": True},
        },
    }


def first_sync_filter() -> dict[str, Any]:
    """The filter of a channel's first (full) sync: one event per room, and a nonce.

    Synapse answers a repeated sync request (same user, device, since, timeout and filter text)
    from a cache for 2 minutes. A restarted channel's first sync would then get the previous
    one's answer: an old position, without the rooms the bot was invited to since, so it would
    not join them until its next sync. A random 128-bit event type among those already excluded
    makes every first sync a new request and changes nothing it returns. (A random timeout did
    this before: two starts drew the same one 1 time in 5,000, and a CI run failed with exactly
    what that gives, the bot not yet in a room it had been invited to.)"""
    filter_ = sync_filter(1)
    filter_["presence"] = {"not_types": ["*", f"ironclaw.first-sync.{secrets.token_hex(16)}"]}
    return filter_


# Answers that cannot turn out differently when the same request is made again.
_FATAL = frozenset({
    "M_FORBIDDEN", "M_UNKNOWN_TOKEN", "M_MISSING_TOKEN", "M_USER_DEACTIVATED", "M_NOT_JSON",
    "M_BAD_JSON", "M_TOO_LARGE", "M_NOT_FOUND", "M_INVALID_PARAM",
})  # fmt: skip
_NETWORK = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


def _failure(channel: str, what: str, response: Any) -> ChannelFailed:
    """ChannelFailed for a ``nio.ErrorResponse``: not retryable for a refusal (a Matrix error code
    in _FATAL, or an HTTP 4xx other than 408/429), retryable otherwise (429, 5xx)."""
    errcode = str(getattr(response, "status_code", "") or "")
    status = getattr(getattr(response, "transport_response", None), "status", 0)
    status = status if isinstance(status, int) else 0
    fatal = errcode in _FATAL or (400 <= status < 500 and status not in (408, 429))
    message = str(getattr(response, "message", "") or "")[:200]
    said = " ".join(p for p in (f"HTTP {status}" if status else "", errcode, message) if p)
    return ChannelFailed(f"matrix channel {channel}: {what}: {said}", retryable=not fatal)


class MatrixChannel:
    """One ``[[channels]]`` table of type ``matrix`` (a ``ChannelAdapter``)."""

    kind = "matrix"

    def __init__(
        self,
        config: ChannelConfig,
        secret: Callable[[str], str],
        clock: Clock,
        *,
        timeline_limit: int = TIMELINE_LIMIT,
    ) -> None:
        self._filter = sync_filter(timeline_limit)
        self.name = config.name
        self._config = config
        self._secret = secret
        self._clock = clock
        self._client: Any = None  # nio.AsyncClient, made on first use
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._ready = asyncio.Event()
        self._handing = False  # a batch is being handed to the sink: stop() lets it finish
        self._connected = False
        self._last_error = ""
        self._last_error_at = 0.0
        self._counters: Counter[str] = Counter()
        self._reader = ev.Reader(config.name, config.user_id, (), config.max_message_bytes)
        self._joined: set[str] = set()
        self._invited: set[str] = set()
        self._per_sender = ev.Meter(config.sender_messages_per_minute, clock.monotonic)
        self._per_channel = ev.Meter(config.channel_messages_per_minute, clock.monotonic)
        # The meters' verdicts on the batch being handed over: a batch tried again (the inbox
        # raised) gets the same ones, so a retry never turns a taken message into a dropped one.
        self._metered: dict[str, bool] = {}

    # -- the ChannelAdapter port -------------------------------------------------------------

    async def start(self, sink: InboxSink) -> None:
        """Begin syncing; returns once the first sync succeeded or failed (status() says), or
        after START_WAIT_SECONDS."""
        if self._task is not None:
            return
        self._stopping = asyncio.Event()
        self._ready = asyncio.Event()
        self._task = asyncio.create_task(self._run(sink), name=f"matrix channel {self.name}")
        # A homeserver that does not answer must not hold up the daemon (or the other
        # channels): the loop goes on in the background and status() says what happens.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._ready.wait(), START_WAIT_SECONDS)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            self._stopping.set()
            if self._handing:
                # Let the batch being handed over finish (its cursor saved), but not forever: a
                # stuck inbox must not hold up the daemon's stop (the batch comes again).
                await asyncio.wait({task}, timeout=STOP_GRACE_SECONDS)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._connected = False
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def deliver(self, reply: OutboundReply) -> None:
        relates: dict[str, Any] = {}
        if reply.in_reply_to_event:
            relates["m.in_reply_to"] = {"event_id": reply.in_reply_to_event}
        if reply.thread:
            relates.update(rel_type="m.thread", event_id=reply.thread, is_falling_back=True)
        content: dict[str, Any] = {"msgtype": "m.text", "body": reply.text}
        if relates:
            content["m.relates_to"] = relates
        what = f"sending to {reply.where}"
        client = self._ensure_client()
        try:
            response = await client.room_send(
                reply.where, "m.room.message", content, tx_id=reply.delivery_id
            )
        except _NETWORK as exc:
            raise self._network(what, exc) from exc
        if isinstance(response, nio.ErrorResponse):
            self._counters["deliver_failed"] += 1
            raise _failure(self.name, what, response)
        self._counters["delivered"] += 1

    def status(self) -> ChannelStatus:
        return ChannelStatus(
            name=self.name,
            kind=self.kind,
            connected=self._connected,
            detail=f"{self._config.homeserver} as {self._config.user_id}",
            last_error=self._last_error,
            last_error_at=self._last_error_at,
            counters=dict(self._counters),
        )

    async def test(self) -> str:
        """Log in with the credential's token on a fresh connection and ask who it is."""
        client = self._new_client(self._token())
        try:
            response = await client.whoami()
        except _NETWORK as exc:
            raise self._network("asking who the token belongs to", exc) from exc
        finally:
            await client.close()
        if isinstance(response, nio.ErrorResponse):
            raise _failure(self.name, "asking who the token belongs to", response)
        user_id, device = str(response.user_id), str(response.device_id or "")
        if user_id != self._config.user_id:
            raise ChannelFailed(
                f"matrix channel {self.name}: the token of credential "
                f"{self._config.token_credential} belongs to {user_id}, "
                f"not {self._config.user_id}",
                retryable=False,
            )
        return f"logged in to {self._config.homeserver} as {user_id} (device {device})"

    # -- the sync loop -----------------------------------------------------------------------

    async def _run(self, sink: InboxSink) -> None:
        backoff = BACKOFF_FIRST
        since: str | None = None
        while not self._stopping.is_set():
            try:
                if since is None:
                    since = await self._prime(sink)
                    self._ready.set()
                since = await self._step(sink, since)
                backoff = BACKOFF_FIRST
            except Exception as exc:  # the channel must outlive any one failure
                self._connected = False
                self._error(exc)
                self._ready.set()
                await self._pause(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)

    async def _prime(self, sink: InboxSink) -> str:
        """A full sync (every room and pending invite), joins wired invites, takes the display
        name; the saved cursor, or this sync's token saved as the first one."""
        batch = await self._sync(None, 0, first_sync_filter())
        self._invited = set(batch.invited)
        self._joined = {room.room_id for room in batch.joined}
        await self._take_names()
        await self._join_wired(sink)
        cursor = await sink.cursor(self.name)
        if cursor is None:
            await sink.save_cursor(self.name, batch.next_batch)
            cursor = batch.next_batch
        return cursor

    async def _step(self, sink: InboxSink, since: str) -> str:
        timeout = INVITED_SYNC_TIMEOUT_MS if self._invited else SYNC_TIMEOUT_MS
        batch = await self._sync(since, timeout, self._filter)
        self._handing = True
        try:
            await self._hand_rooms(sink, batch, since)
            await sink.save_cursor(self.name, batch.next_batch)
            self._metered.clear()
        finally:
            self._handing = False
        self._joined = (self._joined | {r.room_id for r in batch.joined}) - batch.left
        self._invited = (self._invited | batch.invited) - self._joined - batch.left
        await self._join_wired(sink)
        return batch.next_batch

    async def _sync(
        self, since: str | None, timeout_ms: int, filter_: dict[str, Any]
    ) -> ev.SyncBatch:
        client = self._ensure_client()
        try:
            response = await client.sync(timeout=timeout_ms, since=since, sync_filter=filter_)
        except _NETWORK as exc:
            raise self._network("syncing", exc) from exc
        if isinstance(response, nio.ErrorResponse):
            self._counters["sync_errors"] += 1
            raise _failure(self.name, "syncing", response)
        self._connected = True
        return ev.sync_batch(response)

    async def _hand_rooms(self, sink: InboxSink, batch: ev.SyncBatch, since: str) -> None:
        """Hand every room's new messages to the inbox. A room whose receive (or gap) raises
        stops there and the next room goes on: one room whose agent cannot take its messages
        stopped every room of the bot, of every agent (found by a review). The first error is
        raised once every room had its turn, so the batch comes again; a full disk at once."""
        failed: list[Exception] = []
        for room in batch.joined:
            try:
                await self._hand_room(sink, room, since)
            except DiskFull:
                raise  # no room's messages can be taken: the batch waits for space
            except Exception as exc:  # the room's part of the batch comes again
                self._counters["room_failed"] += 1
                failed.append(exc)
        if failed:
            raise failed[0]

    async def _hand_room(self, sink: InboxSink, room: ev.RoomTimeline, since: str) -> None:
        events = list(room.events)
        own_join = ev.joined_by(events, self._config.user_id)
        if own_join is not None:
            # Joined in this batch: what the room said before the bot was there is not answered.
            events = events[own_join + 1 :]
        elif room.limited and room.prev_batch:
            events = [*await self._backfill(room.room_id, room.prev_batch, since), *events]
        for source in events:
            got = self._reader.read(room.room_id, source, self._clock.time())
            if isinstance(got, str):
                self._counters[got] += 1
            elif (refused := sink.screen(self.name, got.where, got.sender)) is not None:
                # Before the meters: a stranger's event spends no one's rate.
                self._counters[refused.value] += 1
            elif not self._allowed(got.event_id, got.sender):
                self._counters["rate_limited"] += 1
            else:
                receipt = await sink.receive(got)
                self._counters["received"] += 1
                self._counters[receipt.admission.value] += 1

    def _allowed(self, event_id: str, sender: str) -> bool:
        verdict = self._metered.get(event_id)
        if verdict is None:
            verdict = self._per_sender.take(sender) and self._per_channel.take("")
            self._metered[event_id] = verdict
        return verdict

    async def _backfill(self, room_id: str, prev_batch: str, since: str) -> list[Any]:
        """The events the server left out of a limited timeline (between ``since`` and
        ``prev_batch``), oldest first."""
        client = self._ensure_client()
        newest_first: list[Any] = []
        token = prev_batch
        for _ in range(MAX_BACKFILL_PAGES):
            try:
                response = await client.room_messages(
                    room_id, start=token, end=since, direction=nio.MessageDirection.back,
                    limit=PAGE_LIMIT,
                )  # fmt: skip
            except _NETWORK as exc:
                raise self._network(f"fetching the gap in {room_id}", exc) from exc
            if isinstance(response, nio.ErrorResponse):
                raise _failure(self.name, f"fetching the gap in {room_id}", response)
            events, end = ev.page_events(response)
            newest_first.extend(events)
            if not events or not end or end == token:
                break
            token = end
        else:
            self._counters["gaps_cut"] += 1
        self._counters["backfilled"] += len(newest_first)
        return newest_first[::-1]

    async def _join_wired(self, sink: InboxSink) -> None:
        """Join the rooms the bot is invited to that some agent is wired to; the others are left
        as they are (a route approved later joins them then)."""
        for room_id in sorted(self._invited & sink.wired(self.name)):
            try:
                response = await self._ensure_client().join(room_id)
            except _NETWORK as exc:
                self._error(self._network(f"joining {room_id}", exc))
                continue
            if isinstance(response, nio.ErrorResponse):
                self._error(_failure(self.name, f"joining {room_id}", response))
                continue
            self._invited.discard(room_id)
            self._joined.add(room_id)
            self._counters["joined"] += 1

    async def _take_names(self) -> None:
        with contextlib.suppress(*_NETWORK):
            response = await self._ensure_client().get_displayname(self._config.user_id)
            name = getattr(response, "displayname", None)
            names = (name,) if isinstance(name, str) and len(name) >= 3 else ()
            self._reader = dataclasses.replace(self._reader, names=names)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    # -- the client --------------------------------------------------------------------------

    def _token(self) -> str:
        try:
            return self._secret(self._config.token_credential)
        except IronclawError as exc:
            raise ChannelFailed(f"matrix channel {self.name}: the access token: {exc}") from exc

    def _new_client(self, token: str) -> Any:
        config = nio.AsyncClientConfig(
            max_limit_exceeded=0, max_timeouts=0, request_timeout=30,
            store_sync_tokens=False, encryption_enabled=False,
        )  # fmt: skip
        client = nio.AsyncClient(
            self._config.homeserver, self._config.user_id, device_id=self._config.device_id,
            config=config,
        )  # fmt: skip
        client.restore_login(self._config.user_id, self._config.device_id, token)
        return client

    def _ensure_client(self) -> Any:
        token = self._token()
        if self._client is None:
            self._client = self._new_client(token)
        elif self._client.access_token != token:
            self._client.access_token = token  # the credential was rotated
        return self._client

    def _network(self, what: str, exc: BaseException) -> ChannelFailed:
        return ChannelFailed(
            f"matrix channel {self.name}: {what}: {type(exc).__name__}: {exc}"[:400]
        )

    def _error(self, exc: BaseException) -> None:
        self._last_error = str(exc)[:400] if isinstance(exc, IronclawError) else repr(exc)[:400]
        self._last_error_at = self._clock.time()
        self._counters["errors"] += 1
        log.warning("%s", self._last_error)
