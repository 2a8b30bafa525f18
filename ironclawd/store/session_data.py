"""A session's data (``ports.SessionData``): its key (wrapped in the state DB, unwrapped only on
tmpfs while it runs) and its queue directories. Destroying the key makes the queues unreadable."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ironclawd import paths, ratelog
from ironclawd.domain.messages import QueueLimits, Reply
from ironclawd.errors import HostError, IronclawError
from ironclawd.store import queues
from ironclawd.store.diskspace import check_free
from ironclawd.store.keys import (
    MasterKey,
    new_session_key,
    remove_tmpfs_key,
    write_tmpfs_key,
    write_tmpfs_key_in_place,
    write_tmpfs_placeholder,
)
from ironclawd.store.outbound import OUTBOUND_FILE, OutboundReader, restore_outbound, strip_setid
from ironclawd.store.queues import InboundWriter
from ironclawd.store.quota_mount import OutboundQuota, is_mounted
from ironclawd.store.state import StateStore

if TYPE_CHECKING:
    from ironclawd.ports import MountSpace

log = logging.getLogger("ironclawd.sessions")
T = TypeVar("T")


@dataclass(frozen=True)
class DataLayout:
    queues_dir: Path  # /var/lib/ironclaw/queues
    keys_dir: Path  # /run/ironclaw/keys (tmpfs)
    scratch_dir: Path = paths.INGEST_DIR  # root-only: private copies of outbound.db
    limits: QueueLimits = field(default_factory=QueueLimits)
    state_dir: Path = paths.STATE_DIR  # whose filesystem min_free_bytes is checked on
    min_free_bytes: int = 0  # [daemon] min_free_bytes; 0: no check


class SessionDataStore:
    """With ``space`` (the daemon's wiring), each outbound tmpfs is mounted in that mount
    namespace, not the host's (host/mountns.py); without, on the host (the unit tier)."""

    def __init__(
        self,
        store: StateStore,
        master: MasterKey,
        layout: DataLayout,
        space: MountSpace | None = None,
    ) -> None:
        self._store = store
        self._master = master
        self.layout = layout
        self.space = space

    def _in_space(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` where the outbound mounts are (paths are then the space's own)."""
        if self.space is None:
            return fn(*args)
        result: T = self.space.call(fn, *args)
        return result

    def check_space(self, doing: str) -> None:
        """Refuse (DiskFull, naming the directory and ``daemon.min_free_bytes``) new work while
        the state directory's filesystem is below the threshold."""
        check_free(self.layout.state_dir, self.layout.min_free_bytes, doing)

    def key(self, sid: str) -> bytes:
        wrapped = self._store.wrapped_key(sid)
        if wrapped is None:
            raise HostError(f"session {sid}: no key (it was destroyed)")
        return self._master.unwrap(sid, wrapped)

    def prepare(self, sid: str, uid: int, gid: int) -> bytes:
        """Make sure the session has a key and queue dirs; put its key on tmpfs for the box."""
        if self._store.wrapped_key(sid) is None:
            self._store.put_wrapped_key(sid, self._master.wrap(sid, new_session_key()))
        key = self.key(sid)
        limits = self.layout.limits
        quota = OutboundQuota(limits.outbound_bytes, limits.outbound_files)
        fresh = not self._in_space(is_mounted, self._outbound_native(sid))
        self._in_space(queues.prepare_queue_dirs, self.layout.queues_dir, sid, uid, gid, quota)
        if fresh and not (self.outbound_dir(sid) / OUTBOUND_FILE).exists():
            self._restore(sid, key, uid, gid)
        try:  # what an earlier sandbox of this session left, before the next one starts
            self.strip_setid(sid, uid)
        except (IronclawError, OSError) as exc:
            ratelog.warning(log, sid, "outbound setid", "session %s: stripping setid bits from "
                            "its outbound files: %s", sid, exc)  # fmt: skip
        write_tmpfs_key(self.key_path(sid), key, uid, gid)
        return key

    def prepare_pooled(self, sid: str, uid: int, gid: int) -> None:
        """The mount sources of a pooled sandbox, before any session owns ``sid``: empty queue
        directories (the outbound tmpfs mounted) and an empty key file. No key exists yet."""
        if self._store.wrapped_key(sid) is not None:
            raise HostError(f"refusing to pool {sid}: it has a key (a session owns it)")
        limits = self.layout.limits
        quota = OutboundQuota(limits.outbound_bytes, limits.outbound_files)
        self._in_space(queues.prepare_queue_dirs, self.layout.queues_dir, sid, uid, gid, quota)
        write_tmpfs_placeholder(self.key_path(sid), uid, gid)

    def seal(self, sid: str, uid: int, gid: int) -> bytes:
        """Claim of a pooled sandbox: a new key for ``sid``, written into its placeholder. All
        or nothing: a seal that fails leaves no key behind (the sandbox is then destroyed)."""
        if self._store.wrapped_key(sid) is not None:
            raise HostError(f"refusing to seal {sid}: it has a key already")
        if not self.key_path(sid).is_file() or not self.outbound_dir(sid).is_dir():
            raise HostError(f"refusing to seal {sid}: it is not a pooled sandbox (no key "
                            "placeholder or queue directories)")  # fmt: skip
        self._store.put_wrapped_key(sid, self._master.wrap(sid, new_session_key()))
        try:
            key = self.key(sid)
            self.strip_setid(sid, uid)
            # The agent's empty queue, made here in ~0.5 ms instead of by the agent through the
            # sandbox's file system (3-5 ms of its way to the hello), and before the key: an
            # agent that polls its key file sees the key only once the file is there.
            restore_outbound(self.outbound_dir(sid), key, (uid, gid), (),
                             self.layout.scratch_dir,
                             doing=f"claiming a pooled sandbox for session {sid}")  # fmt: skip
            write_tmpfs_key_in_place(self.key_path(sid), key, uid, gid)
        except BaseException:
            self._store.destroy_session_data(sid)  # the key no sandbox holds
            raise
        return key

    def list_sids(self) -> list[str]:
        """The session ids that have queue directories."""
        try:
            return sorted(p.name for p in self.layout.queues_dir.iterdir() if p.is_dir())
        except FileNotFoundError:
            return []

    def _restore(self, sid: str, key: bytes, uid: int, gid: int) -> None:
        """A new outbound tmpfs (a host reboot emptied the old one) for a session that has
        replies: put them back, so its agent resumes where it was. Not those its agent was told
        it may drop ("ingested <seq>"), but always the newest: where it resumes."""
        newest = self._store.last_reply(sid)[0]
        if newest == 0:
            return
        after = min(self._store.pruned(sid), newest - 1)
        rows = ((r.seq, r.in_reply_to, r.created_at, r.body) for r in self._all_replies(sid, after))
        try:
            count = restore_outbound(
                self.outbound_dir(sid), key, (uid, gid), rows, self.layout.scratch_dir
            )
        except IronclawError as exc:  # the agent then answers from the start again: say so
            log.error("session %s: outbound queue was lost and not rebuilt: %s", sid, exc)
            return
        log.warning("session %s: outbound queue was lost; rebuilt %d rows from the record", sid,
                    count)  # fmt: skip

    def _all_replies(self, sid: str, after: int) -> Iterator[Reply]:
        while batch := self._store.replies_after(sid, after, limit=1000):
            yield from batch
            after = batch[-1].seq

    def key_path(self, sid: str) -> Path:
        return self.layout.keys_dir / sid

    def inbound_dir(self, sid: str) -> Path:
        return self.layout.queues_dir / sid / "inbound"

    def _outbound_native(self, sid: str) -> Path:
        return self.layout.queues_dir / sid / "outbound"

    def outbound_dir(self, sid: str) -> Path:
        """Where the daemon's threads reach the session's outbound directory."""
        native = self._outbound_native(sid)
        return native if self.space is None else self.space.view(native)

    def unit_entry(self, sid: str, argv: Sequence[str]) -> tuple[list[str], int | None]:
        if self.space is None:
            return list(argv), None
        native = self._outbound_native(sid)
        fd = self.space.clone(native)
        return self.space.exec_argv(native, argv), fd

    def outbound_reader(self, sid: str, uid: int) -> OutboundReader:
        return OutboundReader(
            self.outbound_dir(sid), self.key(sid), uid, self.layout.scratch_dir,
            self.layout.limits.outbound_bytes,
        )  # fmt: skip

    def inbound(self, sid: str, gid: int) -> InboundWriter:
        """A writer of the session's inbound queue (group ``gid`` may read it)."""
        return InboundWriter(self.inbound_dir(sid), self.key(sid), gid)

    def outbound(self, sid: str, uid: int) -> OutboundReader:
        return self.outbound_reader(sid, uid)

    def strip_setid(self, sid: str, uid: int) -> int:
        """Clear setuid/setgid bits the box left in its outbound directory; how many."""
        return strip_setid(self.outbound_dir(sid), uid, self.layout.limits.outbound_files + 1)

    def release(self, sid: str) -> None:
        """The sandbox is gone: take the unwrapped key off tmpfs."""
        remove_tmpfs_key(self.key_path(sid))

    def destroy(self, sid: str) -> None:
        """Forget the key for good, then delete the queue files."""
        self.release(sid)
        self._store.destroy_session_data(sid)
        self._in_space(queues.remove_queue_dirs, self.layout.queues_dir, sid)
