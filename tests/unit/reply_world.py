"""The real session and message services over real SQLCipher files in a tmp dir: the state DB
(store/state.py), each session's key wrapped in it, its inbound.db written by the daemon's
writer (store/queues.py) and its outbound.db written by the agent's own code (agent/queues.py)
and read as the daemon reads it (store/outbound.py). Only the sandbox's host effects (units,
netns, runsc, mounts) are the fakes of tests/fakes. The agent's uid is the test's own: the unit
tier changes no owner, and its outbound directory is a plain one, not a tmpfs."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import sqlcipher3

from agent.queues import Outbound as AgentOutbound
from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.messages import QueueLimits
from ironclawd.services.messaging import MessageService
from ironclawd.services.session_hooks import SessionHooks
from ironclawd.services.session_lifecycle import SandboxLayout, SandboxLifecycle
from ironclawd.services.sessions import SessionService
from ironclawd.store.keys import MasterKey, new_session_key
from ironclawd.store.outbound import OUTBOUND_FILE, OutboundReader
from ironclawd.store.queues import InboundWriter
from ironclawd.store.session_data import DataLayout, SessionDataStore
from ironclawd.store.state import StateStore
from tests.fakes import (
    FakeBundles,
    FakeClock,
    FakeControl,
    FakeMounts,
    FakeNetns,
    FakeRuntime,
    FakeSessionData,
    FakeUnits,
    RecordingAudit,
)

AGENT = "helper"
MASTER = bytes(range(32))
WAIT = 5.0


class RealQueues(FakeSessionData):
    """``SessionData``: keys and queue files for real (``SessionDataStore``), without the
    outbound tmpfs's mount and the chowns."""

    def __init__(self, root: Path, store: StateStore) -> None:
        super().__init__()
        self.layout = DataLayout(queues_dir=root / "queues", keys_dir=root / "keys",
                                 scratch_dir=root / "scratch", state_dir=root)  # fmt: skip
        self.master = MasterKey(MASTER, "test")
        self.real = SessionDataStore(store, self.master, self.layout)
        self.store = store

    def prepare(self, sid: str, uid: int, gid: int) -> bytes:
        super().prepare(sid, uid, gid)
        if self.store.wrapped_key(sid) is None:
            self.store.put_wrapped_key(sid, self.master.wrap(sid, new_session_key()))
        for name, mode in (("inbound", 0o750), ("outbound", 0o700)):
            (self.layout.queues_dir / sid / name).mkdir(mode=mode, parents=True, exist_ok=True)
        return self.real.key(sid)

    def key(self, sid: str) -> bytes:
        return self.real.key(sid)

    def destroy(self, sid: str) -> None:
        super().destroy(sid)
        self.store.destroy_session_data(sid)
        shutil.rmtree(self.layout.queues_dir / sid, ignore_errors=True)

    def inbound(self, sid: str, gid: int) -> InboundWriter:  # type: ignore[override]
        return self.real.inbound(sid, gid)

    def outbound(self, sid: str, uid: int) -> OutboundReader:  # type: ignore[override]
        return self.real.outbound(sid, uid)

    def strip_setid(self, sid: str, uid: int) -> int:
        return self.real.strip_setid(sid, uid)

    def outbound_file(self, sid: str) -> Path:
        return self.layout.queues_dir / sid / "outbound" / OUTBOUND_FILE


@dataclass
class World:
    store: StateStore
    data: RealQueues
    sessions: SessionService
    messages: MessageService
    control: FakeControl
    audit: RecordingAudit
    clock: FakeClock
    boxes: dict[str, AgentOutbound] = field(default_factory=dict)

    def box(self, sid: str) -> AgentOutbound:
        """The session's outbound queue as its agent keeps it open."""
        if sid not in self.boxes:
            self.boxes[sid] = AgentOutbound(self.data.outbound_file(sid), self.data.key(sid))
        return self.boxes[sid]

    async def write(self, sid: str, rows: list[tuple[int, str]]) -> int:
        """The agent writes ``rows`` (in_reply_to, body), as the agent does (or a box that
        chose the in_reply_to), and announces the last; its seq."""
        seq = 0
        for in_reply_to, body in rows:
            seq = self.box(sid).append(in_reply_to, body)
        assert self.control.listener is not None
        await self.control.listener(sid, "outbound", seq)
        return seq

    def left_in_box(self, sid: str) -> list[int]:
        """The seqs still in the session's outbound.db."""
        conn = sqlcipher3.connect(str(self.data.outbound_file(sid)))
        try:
            conn.execute(f"PRAGMA key = \"x'{self.data.key(sid).hex()}'\"")
            return [int(r[0]) for r in conn.execute("SELECT seq FROM messages ORDER BY seq")]
        finally:
            conn.close()

    async def replies(self, sid: str) -> list[tuple[int, int, str]]:
        """(seq, in_reply_to, body) of what was ingested, as a watcher sees it."""
        return [(r.seq, r.in_reply_to, r.body) async for r in self.messages.watch(sid, 0, False)]


def world(root: Path, limits: QueueLimits | None = None, store: StateStore | None = None) -> World:
    """The services over files under ``root`` (``store``: a state DB there already open)."""
    store = store if store is not None else StateStore(root / "state.db", MASTER)
    clock, control, hooks, audit = FakeClock(), FakeControl(), SessionHooks(), RecordingAudit()
    data = RealQueues(root, store)
    layout = SandboxLayout(bundles_dir=root / "bundles", rootfs=root / "rootfs", start_timeout=WAIT,
                           adopt_timeout=WAIT, unit_check_seconds=0.01, idle_timeout=0.0,
                           state_dir=root)  # fmt: skip
    lifecycle = SandboxLifecycle(
        units=FakeUnits(), netns=FakeNetns(), control=control, runtime=FakeRuntime(),
        layout=layout, data=data, mounts=FakeMounts(), bundles=FakeBundles(), sockets=hooks,
    )  # fmt: skip
    sessions = SessionService(store=store, lifecycle=lifecycle, agents={AGENT: AgentSpec(AGENT)},
                              hooks=hooks, audit=audit, clock=clock)  # fmt: skip
    messages = MessageService(store=store, sessions=sessions, hooks=hooks, data=data,
                              control=control, agent_uid=os.getuid(), agent_gid=os.getgid(),
                              audit=audit, clock=clock, limits=limits)  # fmt: skip
    return World(store, data, sessions, messages, control, audit, clock)
