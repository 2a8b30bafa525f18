"""The message path: operator -> inbound queue -> agent -> outbound queue -> ingest -> operator.

Sending appends to the session's inbound.db (the host is its only writer) and announces the new
seq on the control socket; the agent announces each outbound commit the same way, and the host
ingests the new rows into the state DB, extending the session's hash chain. Watchers wait on a
condition, never poll, and are sent recent replies from memory (services/reply_tail.py); the
event loop itself never waits on a database. Exactly-once as the operator sees it: replies have
a per-session seq and a watcher resumes after the last seq it saw; a send retried with the same
client id returns the seq of the first.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ironclawd import ratelog
from ironclawd.domain.message_ids import MessageId, message_id
from ironclawd.domain.messages import (
    QueueLimits,
    Reply,
    accept_row,
    chain_link,
    check_body,
    check_client_id,
)
from ironclawd.domain.reply_bounds import ReplyUsage, admit, answers, nearing, with_bounds
from ironclawd.domain.session import State
from ironclawd.errors import Conflict, DiskFull, IronclawError, NotFound
from ironclawd.ports import (
    RESYNC,
    AuditSink,
    Clock,
    ControlPlane,
    InboundQueue,
    OutboundRows,
    RawRow,
    ReplyRecords,
    SessionData,
)
from ironclawd.services.append_fence import AppendFence
from ironclawd.services.audit import Throttled
from ironclawd.services.ingest_holds import IngestHolds
from ironclawd.services.lanes import Lanes
from ironclawd.services.reply_tail import ReplyTail
from ironclawd.services.session_hooks import SessionHooks
from ironclawd.services.sessions import SessionService

log = logging.getLogger("ironclawd.messages")

# A sandbox that dies with messages unanswered is started again, at most this often: an agent
# that crashes on a message must not be restarted in a tight loop.
RESTARTS_PER_WINDOW = 5
RESTART_WINDOW_SECONDS = 60.0
# Replies the agent wrote while the state DB's disk was full are ingested again this often until
# it takes them: waiting for the agent's next announcement would leave them unseen until then.
INGEST_RETRY_SECONDS = 1.0
INGEST_RETRY_MAX_SECONDS = 60.0  # between tries of a read that failed (not a full disk)
WATCH_BATCH = 1000

_DISK_FULL = message_id(MessageId.DISK_FULL)


@dataclass(frozen=True)
class Sent:
    seq: int
    new: bool
    replies_before: int


@dataclass(frozen=True)
class ChainReport:
    checked: int
    ok: bool
    first_bad_seq: int = 0
    problem: str = ""
    pruned: int = 0  # ingested rows the agent dropped as told: not compared


class MessageService:
    def __init__(
        self,
        *,
        store: ReplyRecords,
        sessions: SessionService,
        hooks: SessionHooks,
        data: SessionData,
        control: ControlPlane,
        agent_uid: int,
        agent_gid: int,
        audit: AuditSink,
        clock: Clock,
        limits: QueueLimits | None = None,
    ) -> None:
        self.store = store
        self._sessions = sessions
        self._data = data
        self._control = control
        self._uid = agent_uid
        self._gid = agent_gid
        self._inbound: dict[str, InboundQueue] = {}
        self._tails: dict[str, ReplyTail] = {}
        # Each session's life here: a token made at its first use and dropped at its removal.
        # A handle (writer, reader), tail or reply made for a life that has ended is not kept,
        # so nothing of a removed session reaches a later session of the same id; and while a
        # removal is under way (``_removing``) no new life starts.
        self._lives: dict[str, object] = {}
        self._removing: set[str] = set()
        self._fence = AppendFence()  # a removal if unused holds sends back (append_fence.py)
        self._recording: dict[str, asyncio.Lock] = {}  # held over add_replies and its check
        self._readers: dict[str, OutboundRows] = {}  # used only in the session's lane
        self._writers_lock = threading.Lock()  # guards the two dicts, never held for an open
        self._opening: dict[str, threading.Lock] = {}  # a writer being opened, per session
        self._ingest_locks: dict[str, asyncio.Lock] = {}
        self._changed: dict[str, asyncio.Condition] = {}
        self._restarts: dict[str, list[float]] = {}
        self._retries: dict[str, asyncio.Task[None]] = {}
        # Sessions whose announced replies were not taken (a read or a record failed): tried
        # again until they are, as the agent announces each commit once.
        self._untaken: set[str] = set()
        self._slow: set[str] = set()  # of those, failed otherwise than by a full disk
        self._pruned: dict[str, int] = {}  # the last "ingested <seq>" told to each agent
        self._sent: dict[str, int] = {}  # the newest inbound seq known, per session
        # The host users who sent each session messages ("uid:N(name)"): four-eyes keeps them
        # from approving what that session submits (services/gateway.py). Recorded in the
        # state DB (a restart adopts the session, its queue and what was asked of it); this
        # is only which of them were recorded already.
        self._senders: dict[str, set[str]] = {}
        self._limits = limits or QueueLimits()
        # Each session reads its agent's file in its own lane: one hostile session cannot hold
        # the threads every other session's sends and creates need.
        self._lanes = Lanes(self._limits.read_timeout_seconds)
        self._clock = clock
        self._refusals = Throttled(audit, clock)
        self._holds = IngestHolds(self._refusal)  # sessions held at a bound (reply_bounds.py)
        self._kicks: set[asyncio.Task[None]] = set()  # held sessions tried again after a reload
        control.set_listener(self._on_event)
        control.set_unsettled(self.unsettled)
        hooks.on_sandbox_exit(self.resume_unanswered)
        hooks.on_removing(self.settle_removal)
        hooks.on_fence(self.fence_unused, self._fence.lift)
        hooks.on_gone(self.gone)

    def _life(self, sid: str) -> object | None:
        """The token of ``sid``'s life here (made at its first use); None while it is being
        removed. Taken on the loop when a send, ingest, watch or check starts."""
        with self._writers_lock:
            if sid in self._removing:
                return None
            return self._lives.setdefault(sid, object())

    def _alive(self, sid: str, life: object) -> bool:
        return self._lives.get(sid) is life

    async def send(self, sid: str, body: str, client_id: str = "", sender: str = "") -> Sent:
        """Queue ``body`` for ``sid``'s agent (starting the session if it was stopped).
        ``sender``: the host user sending it ("uid:N(name)"), remembered for the session's life
        (``senders``); channels' senders are no host users and give none."""
        check_body(body)
        check_client_id(client_id)
        session = self._sessions.get(sid)
        if session.state is not State.RUNNING:
            await asyncio.to_thread(self._data.check_space, f"sending to session {sid}")
            # An idle-stopped session starts again on the next message (docs/architecture.md §3).
            session = await self._sessions.start(sid)
        life = self._life(sid)
        if life is None:
            raise NotFound(f"session {sid} is being removed")
        await self._fence.passable(sid)
        replies_before = (await self._tail(sid, life)).last
        seq, new = await asyncio.to_thread(
            self._append, sid, body, self._clock.time(), client_id or None, life, sender=sender
        )
        self._touch(sid)
        if not await self._control.send(sid, "inbound", seq):
            await self._stranded(sid, seq)
        return Sent(seq, new, replies_before)

    async def _stranded(self, sid: str, seq: int) -> None:
        """Message ``seq`` is queued and its agent was not told. A session stopped since the
        send found it running (an idle stop) is started again, as a send that found it stopped
        starts it: nothing would read the message until the next one otherwise. Its agent
        resumes after the last message it answered. One whose sandbox died meanwhile is
        resumed as its exit hook resumes it (at most RESTARTS_PER_WINDOW): that hook may have
        looked for unanswered messages before this one was in the queue."""
        try:
            state = self._sessions.get(sid).state
            if state in (State.STOPPING, State.STOPPED):
                log.info("session %s stopped while message %d was queued: starting it", sid, seq)
                await self._sessions.start(sid)
                return
        except IronclawError as exc:  # the message is queued: a later send or start reads it
            log.error("session %s: starting it for message %d: %s", sid, seq, exc)
            return
        if state is State.FAILED:
            await self.resume_unanswered(sid)
            return
        log.warning("session %s: agent not connected; message %d waits in its queue", sid, seq)

    def _append(
        self, sid: str, body: str, now: float, client_id: str | None, life: object, *, sender: str
    ) -> tuple[int, bool]:
        """In a worker thread: the free-space check, the sender recorded (before the agent
        can read what it sent) and the append in one hop off the loop (each hop is a wake-up
        of a thread and of the loop again, on the path of every send)."""
        self._data.check_space(f"sending to session {sid}")
        with self._fence.appending(sid):
            if sender:
                self._record_sender(sid, sender, life)
            seq, new = self._writer(sid, life).append(body, now, client_id)
        self._note_sent(sid, seq, life)
        return seq, new

    def _note_sent(self, sid: str, seq: int, life: object) -> None:
        if self._alive(sid, life):
            self._sent[sid] = max(seq, self._sent.get(sid, 0))

    async def _sent_up_to(self, sid: str, life: object, rows: list[RawRow]) -> int:
        """The newest inbound seq, for ``rows`` just read: as sends noted it or, if a row
        answers a newer one, as the queue has it (after a restart no send noted it, and one
        noting it may be under way). Read after the rows: what they answer was sent before."""
        sent = self._sent.get(sid, 0)
        if max((answers(raw[1]) for raw in rows), default=0) > sent:
            sent = await asyncio.to_thread(lambda: self._writer(sid, life).last_seq())
            self._note_sent(sid, sent, life)
        return sent

    async def fence_unused(self, sid: str) -> bool:
        """Whether no message was ever queued to ``sid``, read once the sends under way have
        appended and with no new one let in; if so, none is until ``SessionHooks.lift``."""
        life = self._life(sid)
        if life is None:
            raise Conflict(f"session {sid} is being removed")
        return await self._fence.unused(sid, lambda: self._writer(sid, life).last_seq())

    def _record_sender(self, sid: str, sender: str, life: object) -> None:
        known = self._senders.setdefault(sid, set())
        if sender not in known and self._alive(sid, life):
            self.store.add_sender(sid, sender)
            known.add(sender)

    def _writer(self, sid: str, life: object) -> InboundQueue:
        """The session's inbound writer, opened at its first send. Runs in worker threads: two
        first sends to one session must not open two writers for one file, and an open (file,
        key, schema: several ms on disk) holds up only that session's sends, not every other's
        (after a restart each session's first send opens one). NotFound if ``life`` has ended
        (the session was removed): a writer opened meanwhile is closed, not kept for a later
        session of the same id."""
        with self._writers_lock:
            if not self._alive(sid, life):
                raise NotFound(f"session {sid} was removed")
            writer = self._inbound.get(sid)
            if writer is not None:
                return writer
            opening = self._opening.setdefault(sid, threading.Lock())
        with opening:
            with self._writers_lock:
                writer = self._inbound.get(sid)
            if writer is None:
                writer = self._data.inbound(sid, self._gid)
                with self._writers_lock:
                    ended = not self._alive(sid, life)
                    if not ended:
                        self._inbound[sid] = writer
                        # Whoever waits on this lock now finds the writer. (After a failed open
                        # it stays, so that the next tries still take turns; forget drops it.)
                        self._opening.pop(sid, None)
                if ended:
                    writer.close()
                    raise NotFound(f"session {sid} was removed")
            return writer

    async def resume_unanswered(self, sid: str) -> None:
        """Start a failed session again if it has messages its agent has not answered: an
        accepted message is answered even when no further send comes to restart the sandbox
        (its agent resumes after the last message it answered)."""
        life = self._life(sid)
        if life is None:
            return
        try:
            if not await asyncio.to_thread(self._has_unanswered, sid, life):
                return
        except IronclawError as exc:
            log.warning("session %s: checking for unanswered messages: %s", sid, exc)
            return
        now = self._clock.monotonic()
        recent = [t for t in self._restarts.get(sid, []) if now - t < RESTART_WINDOW_SECONDS]
        if len(recent) >= RESTARTS_PER_WINDOW:
            log.error(
                "session %s: sandbox died %d times in %.0fs with messages unanswered: "
                "not starting it again until the next message",
                sid, len(recent), RESTART_WINDOW_SECONDS,
            )  # fmt: skip
            return
        self._restarts[sid] = [*recent, now]
        log.warning("session %s: sandbox gone with messages unanswered: starting it again", sid)
        try:
            await self._sessions.start(sid)
        except IronclawError as exc:
            log.error("session %s: starting it again: %s", sid, exc)

    async def resume_all(self, sids: list[str]) -> None:
        """After reconcile: resume each settled session that has unanswered messages."""
        for sid in sids:
            await self.resume_unanswered(sid)

    def _has_unanswered(self, sid: str, life: object) -> bool:
        newest = self._writer(sid, life).last_seq()
        last, _chain = self.store.last_reply(sid)
        answered = self.store.replies_after(sid, last - 1, limit=1) if last else []
        return newest > (answered[0].in_reply_to if answered else 0)

    def note_sender(self, sid: str, sender: str) -> None:
        """Count ``sender`` (a host user, "uid:N(name)") among those who sent ``sid`` messages:
        an operator admitting a held channel message chose that it reaches the session."""
        life = self._life(sid)
        if life is not None:
            self._record_sender(sid, sender, life)

    def senders(self, sid: str) -> frozenset[str]:
        """The host users who have sent ``sid`` messages in its life ("uid:N(name)"), as the
        state DB has them (read in the gateway's worker thread at a session's submission)."""
        return self.store.senders(sid)

    def forget(self, sid: str) -> None:
        """The session is being removed: end its life here (nothing new is made for it until
        ``gone``) and close its queue handles."""
        with self._writers_lock:
            self._removing.add(sid)
            self._lives.pop(sid, None)
            opening = self._opening.get(sid)
        if opening is not None:
            with opening:  # an open under way ends first, and its writer is closed below
                pass
        with self._writers_lock:
            writer = self._inbound.pop(sid, None)
            self._opening.pop(sid, None)
        if writer is not None:
            writer.close()
        self._tails.pop(sid, None)
        self._pruned.pop(sid, None)
        self._sent.pop(sid, None)
        self._senders.pop(sid, None)
        self._lanes.close(sid, then=lambda: self._drop_reader(sid))
        self._untaken.discard(sid)
        self._slow.discard(sid)
        # A new session given the id must not inherit a spent window of refusal records.
        self._refusals.forget(sid)
        self._refusals.forget(f"{sid}/outbound")
        self._refusals.forget(f"{sid}/held")
        self._holds.forget(sid)
        retry = self._retries.pop(sid, None)
        if retry is not None:
            retry.cancel()

    async def settle_removal(self, sid: str) -> None:
        """``forget``, then wait for replies being recorded for the session (the state DB is
        written in a thread): the removal destroys its data next, and nothing recorded after
        that may outlive it. Watchers of the session are woken to end."""
        self.forget(sid)
        async with self._recording.setdefault(sid, asyncio.Lock()):
            pass
        condition = self._changed.get(sid)
        if condition is not None:
            async with condition:
                condition.notify_all()

    def gone(self, sid: str) -> None:
        """The removed session's data and record are gone: its id may name a new session."""
        with self._writers_lock:
            self._removing.discard(sid)
        for per_session in (self._ingest_locks, self._recording, self._changed, self._restarts):
            per_session.pop(sid, None)

    async def _on_event(self, sid: str, event: str, value: int) -> None:
        if event == "outbound":
            taken = await self.ingest(sid, value)
            # Nothing taken, and the agent names the newest reply the host holds (a hello, an
            # agent whose queue is full asking again, agent/loop.py), or its session is held
            # (its queue fills with what is not taken): it may need room, and may have missed
            # the line that said so. Any other announcement that brings nothing (a box
            # announcing rows it never wrote) is not answered: a box that never reads would
            # fill its own socket with the answers, and its connection would be dropped.
            tail = self._tails.get(sid)
            newest = tail is not None and value == tail.last
            held = self._holds.at(sid) is not None
            await self._offer_pruning(sid, asked=not taken and (newest or held))
        elif event == RESYNC:  # a held or untaken session, after a restart
            await self.ingest(sid)
            await self._offer_pruning(sid, asked=True)

    async def _offer_pruning(self, sid: str, *, asked: bool = False) -> None:
        """Every ``prune_after_rows`` ingested replies, tell the agent "ingested <seq>": it may
        drop its rows up to seq. Its outbound.db lives on a tmpfs of fixed size and is copied
        whole at each ingest, so it must not grow with the session's age. The seq is recorded
        first: ``verify`` takes a row missing at or below it for pruned, not deleted. ``asked``:
        the agent's queue may be full (agent/loop.py), so everything taken is offered now, and
        said again if it was said before (a line sent while the agent was away is lost)."""
        every = self._limits.prune_after_rows
        life = self._life(sid)
        if every <= 0 or life is None:
            return
        last = (await self._tail(sid, life)).last
        if not self._alive(sid, life):
            return
        told = self._pruned.get(sid)
        if told is None:
            told = await asyncio.to_thread(self.store.pruned, sid)
        if last - told < every and not (asked and last > told):
            self._pruned[sid] = told
            if asked and told:
                await self._control.send(sid, "ingested", told)
            return
        try:
            await asyncio.to_thread(self.store.set_pruned, sid, last)
        except IronclawError as exc:  # a full disk: offered again after the next reply
            ratelog.warning(log, sid, "pruning not recorded",
                            "session %s: not pruning its outbound queue: %s", sid, exc)  # fmt: skip
            return
        self._pruned[sid] = last
        await self._control.send(sid, "ingested", last)

    async def ingest(self, sid: str, up_to: int | None = None, *, again: bool = False) -> int:
        """Copy the agent's new outbound rows into the record; return how many. Never raises
        for what the agent wrote: a row that cannot be taken as it is becomes a placeholder
        (audited), and a file that cannot be read is complained about at a bounded rate.
        ``again``: a retry of a failed ingest, whose failure was audited already."""
        lock = self._ingest_locks.setdefault(sid, asyncio.Lock())
        async with lock:
            life = self._life(sid)
            if life is None:
                return 0
            tail = await self._tail(sid, life)
            total = 0
            while batch := self._next_batch(sid, life, tail, up_to):
                last = tail.last
                try:
                    rows = await self._lanes.run(sid, self._read_batch, sid, last, batch)
                    sent = await self._sent_up_to(sid, life, rows)
                except (IronclawError, OSError) as exc:
                    if not self._alive(sid, life):
                        return total  # removed meanwhile (its queue's writer is closed)
                    # A copy on a full /run, an EIO, a lane's timeout, or the agent's own doing
                    # (a crafted file, which the reader then refuses cheaply until it changes):
                    # tried again, as a failed record is (found by a review: only a full state
                    # DB was, and a reply waited for the agent's next write or a restart).
                    # A retry is not audited again: a crafted file left behind by a session that
                    # then stopped made one audit record a minute for as long as it existed
                    # (found by a review of this stop's diff).
                    if not again:
                        self._refused(sid, str(exc))
                    self._retry_ingest(sid, exc)
                    return total
                replies, usage, held = self._accepted(sid, rows, tail, sent)
                if replies and not await self._record(sid, life, tail, replies, usage):
                    return total
                total += len(replies)
                if held:  # the row and those after it stay in the agent's queue
                    self._holds.hold(sid, tail.last + 1, held)
                # Done at the end of the rows, at a gap or a bound. A read may also end short at its
                # bytes (store/outbound.BATCH_BYTES): then the next batch is read.
                if not rows or len(replies) < len(rows):
                    return total
            return total

    def _next_batch(self, sid: str, life: object, tail: ReplyTail, up_to: int | None) -> int:
        """How many rows to read next; 0 when done: the session was removed (its lane is
        closed, its data going) or ``up_to`` is reached. At ``max_rows`` one, to see whether
        the session is held there (``admit`` says so)."""
        if not self._alive(sid, life) or (up_to is not None and up_to <= tail.last):
            return 0
        if self._holds.at(sid) == tail.last + 1:
            # Held at that row: it alone says whether the hold still applies. A full batch
            # (2 MiB read and decrypted) at each of the box's announcements, when it wrote
            # nothing new, was ~100 MiB/s of reads a held box could ask for (a review).
            return 1
        return max(1, min(self._limits.max_rows - tail.last, self._limits.rows_per_read))

    def _accepted(
        self, sid: str, rows: list[RawRow], tail: ReplyTail, sent: int
    ) -> tuple[list[Reply], ReplyUsage, str]:
        """The rows that follow the tail without a gap and within the session's bounds
        (domain/reply_bounds.py; ``sent``: the newest inbound seq), as replies chained on from
        it; what the session's replies take with them; and why the next row is not taken, if
        a bound stopped them. A row that cannot be taken as it is becomes a placeholder
        (audited)."""
        replies: list[Reply] = []
        last, chain, usage = tail.last, tail.chain, tail.usage
        for raw in rows:
            if raw[0] != last + 1 + len(replies):
                self._refused(sid, f"a gap after seq {last + len(replies)}")
                break
            row, problem = accept_row(*raw, self._limits.max_reply_bytes)
            body = len(raw[3]) if isinstance(raw[3], bytes) and not problem else len(row[3])
            usage, held = admit(usage, raw[0], raw[1], body, sent=sent, limits=self._limits)
            if held:
                return replies, usage, held
            if problem:
                self._refusal(
                    sid, "reply.refused", f"session:{sid}", sid=sid, reply_seq=row[0],
                    reason=problem,
                )  # fmt: skip
            chain = chain_link(chain, *row)
            replies.append(Reply(*row, chain))
        return replies, usage, ""

    async def _record(
        self, sid: str, life: object, tail: ReplyTail, replies: list[Reply], usage: ReplyUsage
    ) -> bool:
        """Store ``replies`` in the state DB, then in the tail, and wake the watchers; False if
        they were not stored (the session was removed during the read, or the state DB failed:
        a full disk, an EIO; then they are tried again until it takes them)."""
        async with self._recording.setdefault(sid, asyncio.Lock()):
            if not self._alive(sid, life):  # its removal waits for this lock: nothing after it
                return False
            try:
                await asyncio.to_thread(self.store.add_replies, sid, replies, usage)
            except IronclawError as exc:
                self._retry_ingest(sid, exc)
                return False
        before, last = tail.usage, tail.last
        tail.add(replies, usage)
        self._holds.near(sid, nearing(before, usage, (last, tail.last), self._limits))
        self._holds.taken(sid)
        self._touch(sid)
        self._sessions.answered(sid)
        condition = self._condition(sid)
        async with condition:
            condition.notify_all()
        return True

    def unsettled(self, sid: str) -> bool:
        """Whether replies ``sid``'s agent announced are not all taken: held at a bound, or
        an ingest that failed being retried (the next daemon reads its queue in full)."""
        return sid in self._untaken or self._holds.at(sid) is not None

    def held(self, sid: str) -> str:
        """Why the session's replies are not ingested and what to do, "" if they are (shown as
        its error: services/ingest_holds.py)."""
        return self._holds.why(sid)

    def configure(self, limits: QueueLimits) -> None:
        """A reload's ``limits``: their bounds apply (reply_bounds.LIVE_KEYS), and each held
        session is tried again under them (its agent announced its rows once)."""
        self._limits = with_bounds(self._limits, limits)
        for sid in self._holds.held():
            task = asyncio.get_running_loop().create_task(self._take_held(sid))
            self._kicks.add(task)
            task.add_done_callback(self._kicks.discard)

    async def _take_held(self, sid: str) -> None:
        try:
            await self.ingest(sid)
            await self._offer_pruning(sid, asked=True)  # its queue may have filled meanwhile
        except IronclawError as exc:
            log.warning("session %s: ingesting under the reloaded bounds: %s", sid, exc)

    def _touch(self, sid: str) -> None:
        """Note activity; on a full disk the persisted time waits for the next touch (what was
        accepted or ingested must still be acknowledged and announced)."""
        try:
            self._sessions.touch(sid)
        except DiskFull as exc:
            ratelog.AGENT_LOG.log(
                log,
                logging.WARNING,
                sid,
                "touch disk full",
                "session %s: activity time: %s",
                sid,
                exc,
                extra=_DISK_FULL,
            )

    def _retry_ingest(self, sid: str, exc: Exception) -> None:
        """The agent's replies could not be read or recorded: try again until they are (the
        agent announced them once and will not again), so no restart is needed when space is
        back. A full disk is retried within 8 s; anything else backs off to a minute."""
        full = isinstance(exc, DiskFull)
        ratelog.AGENT_LOG.log(log, logging.WARNING, sid,
                              "ingest disk full" if full else "ingest retry",
                              "session %s: replies wait in its outbound queue: %s", sid, exc,
                              extra=_DISK_FULL if full else None)  # fmt: skip
        if not full:
            self._slow.add(sid)
        self._untaken.add(sid)
        if sid not in self._retries:
            self._retries[sid] = asyncio.get_running_loop().create_task(
                self._ingest_until_taken(sid), name=f"ingest-retry-{sid}"
            )

    async def _ingest_until_taken(self, sid: str) -> None:
        delay = INGEST_RETRY_SECONDS
        try:
            while sid in self._untaken:
                await asyncio.sleep(delay)
                self._untaken.discard(sid)  # ingest adds it back if it fails again
                self._slow.discard(sid)
                try:
                    await self.ingest(sid, again=True)
                except IronclawError as exc:
                    log.warning("session %s: ingesting again: %s", sid, exc)
                    self._untaken.add(sid)
                    self._slow.add(sid)
                cap = INGEST_RETRY_MAX_SECONDS if sid in self._slow else 8.0
                delay = min(delay * 2, cap)
        finally:
            self._retries.pop(sid, None)
            self._slow.discard(sid)

    def _read_batch(self, sid: str, after: int, limit: int) -> list[RawRow]:
        """In the session's lane: clear setid bits the box planted, then read a batch."""
        self._data.strip_setid(sid, self._uid)
        return self._reader(sid).read_after(after, limit, self._limits.max_reply_bytes)

    def _reader(self, sid: str) -> OutboundRows:
        """The session's outbound reader, kept (with its key) for the session's life. Only in
        the session's lane, so never two at once."""
        reader = self._readers.get(sid)
        if reader is None:
            reader = self._readers[sid] = self._data.outbound(sid, self._uid)
        return reader

    def _drop_reader(self, sid: str) -> None:
        """Close the reader once no read of the lane can be using it (``Lanes.close``)."""
        reader = self._readers.pop(sid, None)
        if reader is not None:
            reader.close()

    async def _tail(self, sid: str, life: object) -> ReplyTail:
        """The session's newest reply and recent ones, from the state DB once."""
        tail = self._tails.get(sid)
        if tail is None:
            tail = await asyncio.to_thread(self._stored_tail, sid)
            if self._alive(sid, life):  # else it is a removed session's: not kept
                # Another caller may have made it meanwhile and ingested since: keep that one.
                tail = self._tails.setdefault(sid, tail)
        return tail

    def _stored_tail(self, sid: str) -> ReplyTail:
        return ReplyTail(*self.store.last_reply(sid), self.store.reply_usage(sid))

    def _refused(self, sid: str, reason: str) -> None:
        ratelog.warning(
            log, sid, "outbound ingest", "session %s: ingesting outbound rows: %s", sid, reason
        )
        self._refusal(
            f"{sid}/outbound", "outbound.refused", f"session:{sid}", sid=sid, reason=reason[:300]
        )

    def _refusal(self, key: str, event: str, actor: str, **fields: Any) -> None:
        """Record what the agent's rows did wrong; a record that fails (a full disk) is logged:
        it aborted the batch, and the replies around it waited (found by a review)."""
        try:
            self._refusals.record(key, event, actor, **fields)
        except (IronclawError, OSError) as exc:
            ratelog.warning(log, key, "refusal not recorded",
                            "session %s: %s not recorded in the audit log: %s",
                            fields.get("sid", key), event, exc)  # fmt: skip

    def _condition(self, sid: str) -> asyncio.Condition:
        return self._changed.setdefault(sid, asyncio.Condition())

    async def watch(self, sid: str, after: int, follow: bool) -> AsyncIterator[Reply]:
        """Replies with seq > after, in order; with ``follow``, keep waiting for new ones."""
        self._sessions.get(sid)  # NotFound for an unknown session
        life = self._life(sid)
        if life is None:
            raise NotFound(f"session {sid} is being removed")
        tail = await self._tail(sid, life)
        condition = self._condition(sid)
        while True:
            if not self._alive(sid, life):
                return  # removed: nothing more will come
            batch = tail.after(after, WATCH_BATCH)
            from_db = batch is None
            if batch is None:
                batch = await asyncio.to_thread(self.store.replies_after, sid, after, WATCH_BATCH)
            if batch:
                for reply in batch:
                    yield reply
                    after = reply.seq
                continue
            if not follow:
                return
            async with condition:
                # Ingestion changes the tail and notifies under this lock: nothing is missed
                # between the check and the wait. (A tail ahead of an empty answer from the
                # DB waits for the next reply rather than asking again at once.)
                if (tail.last <= after or from_db) and self._alive(sid, life):
                    await condition.wait()

    async def verify(self, sid: str) -> ChainReport:
        """Re-read everything ingested from the agent's file and recompute the chain: a
        rewrite, deletion or reorder of already-ingested rows is named by its first seq. A row
        the agent was told it may drop ("ingested <seq>", ``_offer_pruning``) may be missing;
        if it is there, it is compared like the rest."""
        self._sessions.get(sid)
        life = self._life(sid)
        if life is None:
            raise NotFound(f"session {sid} is being removed")
        max_body = self._limits.max_reply_bytes
        pruned_to = await asyncio.to_thread(self.store.pruned, sid)
        checked, pruned, after = 0, 0, 0
        while True:
            record = await asyncio.to_thread(self.store.replies_after, sid, after, 1000)
            if not record:
                return ChainReport(checked, True, pruned=pruned)
            if not self._alive(sid, life):
                raise NotFound(f"session {sid} was removed")
            try:
                now = await self._lanes.run(
                    sid, self._read_range, sid, record[0].seq, record[-1].seq, max_body
                )
            except (IronclawError, OSError) as exc:
                return ChainReport(checked, False, record[0].seq, f"cannot read outbound: {exc}",
                                   pruned)  # fmt: skip
            # The same placeholders ingestion made, so refused rows compare equal.
            by_seq = {raw[0]: accept_row(*raw, max_body)[0] for raw in now}
            for reply in record:
                row = by_seq.get(reply.seq)
                if row is None and reply.seq <= pruned_to:
                    pruned += 1
                    continue
                if row is None:
                    return ChainReport(checked, False, reply.seq, "row deleted by the agent",
                                       pruned)  # fmt: skip
                if row[1:] != (reply.in_reply_to, reply.created_at, reply.body):
                    return ChainReport(checked, False, reply.seq, "row rewritten by the agent",
                                       pruned)  # fmt: skip
                checked += 1
            after = record[-1].seq

    def _read_range(self, sid: str, first: int, last: int, max_body: int) -> list[RawRow]:
        return self._reader(sid).read_range(first, last, max_body)


def verify_record(store: ReplyRecords, sid: str) -> ChainReport:
    """Recompute the host's own chain over what it ingested (detects edits of the record)."""
    previous, after, checked = b"\0" * 32, 0, 0
    while batch := store.replies_after(sid, after):
        for reply in batch:
            if reply.seq != after + 1:
                return ChainReport(checked, False, reply.seq, f"gap before seq {reply.seq}")
            expected = chain_link(
                previous, reply.seq, reply.in_reply_to, reply.created_at, reply.body
            )
            if expected != reply.chain:
                return ChainReport(checked, False, reply.seq, "hash chain broken")
            previous, after = reply.chain, reply.seq
            checked += 1
    return ChainReport(checked, True)
