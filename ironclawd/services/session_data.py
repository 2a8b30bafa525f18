"""A session's data: its key (wrapped in the state DB, unwrapped only on tmpfs while it runs)
and its queue directories. Destroying the key makes the queues unreadable."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ironclawd.errors import HostError
from ironclawd.store import queues
from ironclawd.store.keys import MasterKey, new_session_key, remove_tmpfs_key, write_tmpfs_key
from ironclawd.store.state import StateStore


@dataclass(frozen=True)
class DataLayout:
    queues_dir: Path  # /var/lib/ironclaw/queues
    keys_dir: Path  # /run/ironclaw/keys (tmpfs)


class SessionData:
    def __init__(self, store: StateStore, master: MasterKey, layout: DataLayout) -> None:
        self._store = store
        self._master = master
        self.layout = layout

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
        queues.prepare_queue_dirs(self.layout.queues_dir, sid, uid, gid)
        write_tmpfs_key(self.key_path(sid), key, uid, gid)
        return key

    def key_path(self, sid: str) -> Path:
        return self.layout.keys_dir / sid

    def inbound_dir(self, sid: str) -> Path:
        return self.layout.queues_dir / sid / "inbound"

    def outbound_dir(self, sid: str) -> Path:
        return self.layout.queues_dir / sid / "outbound"

    def release(self, sid: str) -> None:
        """The sandbox is gone: take the unwrapped key off tmpfs."""
        remove_tmpfs_key(self.key_path(sid))

    def destroy(self, sid: str) -> None:
        """Forget the key for good, then delete the queue files."""
        self.release(sid)
        self._store.destroy_session_data(sid)
        queues.remove_queue_dirs(self.layout.queues_dir, sid)
