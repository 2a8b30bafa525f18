"""Recording fakes of the host-effect ports: units, netns, control sockets, runtime, mounts,
bundles, session data and credentials. Each keeps ``calls`` in order, shared when the test
passes one list to several (``log=``), so a test can read the order of effects across them."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ironclawd.bundle.spec import check_spec
from ironclawd.domain.policy import Mount
from ironclawd.domain.skills import AgentSkill
from ironclawd.errors import DiskFull, HostError, NotFound, PolicyDenied
from ironclawd.host.runsc import check_container_id
from ironclawd.host.skills import skill_set_digest
from ironclawd.ports import AgentHello, ControlListener, RawRow, UnitSpec, UnitState

Calls = list[tuple[Any, ...]]


class _Recording:
    def __init__(self, log: Calls | None = None) -> None:
        self.calls: Calls = log if log is not None else []
        self.fail: dict[str, BaseException] = {}  # method -> what it raises (once)

    def _call(self, method: str, *args: Any) -> None:
        self.calls.append((method, *args))
        exc = self.fail.pop(method, None)
        if exc is not None:
            raise exc


class FakeUnits(_Recording):
    """``UnitManager``: started units are active until stopped; ``exit(name, result)`` makes
    one die on its own; a name in ``dies_at_start`` (name -> result) fails right after it
    started, as a unit whose runsc could not create the sandbox does. tests/contract/
    test_host.py holds both knobs and the real ``SystemdUnitManager`` (a unit of /bin/false,
    under ``--real-host``) to one contract."""

    def __init__(self, log: Calls | None = None) -> None:
        super().__init__(log)
        self.units: dict[str, UnitState] = {}
        self.dies_at_start: dict[str, str] = {}
        self.specs: dict[str, UnitSpec] = {}  # the last spec each unit was started with

    def start_transient(self, spec: UnitSpec, timeout: float) -> UnitState:
        self._call("units.start", spec.name)
        self.specs[spec.name] = spec
        state = UnitState(spec.name, "active", "running", 4242, "success")
        self.units[spec.name] = state
        if spec.name in self.dies_at_start:
            self.exit(spec.name, self.dies_at_start[spec.name])
        return state

    def stop(self, name: str, timeout: float) -> None:
        self._call("units.stop", name)
        if name in self.units:
            self.units[name] = UnitState(name, "inactive", "dead", 0, self.units[name].result)

    def list_units(self, pattern: str) -> list[UnitState]:
        prefix = pattern.split("*", 1)[0]
        return [u for n, u in sorted(self.units.items()) if n.startswith(prefix)]

    def reset_failed(self, name: str) -> None:
        self._call("units.reset_failed", name)
        unit = self.units.get(name)
        if unit is not None and unit.active_state in ("inactive", "failed"):
            del self.units[name]

    def wait_inactive(self, name: str, timeout: float) -> UnitState | None:
        """A unit still running is what the real one finds after ``timeout`` (nothing here
        ends it meanwhile): HostError, as the real one raises then."""
        self._call("units.wait_inactive", name)
        state = self.units.get(name)
        if state is not None and state.active_state not in ("inactive", "failed"):
            raise HostError(
                f"waiting for unit {name}: still {state.active_state} after {timeout:g}s"
            )
        return state

    def exit(self, name: str, result: str) -> None:
        self.units[name] = UnitState(name, "failed", "failed", 0, result)


class FakeNetns(_Recording):
    """``NetnsManager``."""

    def __init__(self, log: Calls | None = None) -> None:
        super().__init__(log)
        self.names: set[str] = set()

    def create(self, name: str) -> Path:
        self._call("netns.create", name)
        self.names.add(name)
        return Path("/run/netns") / name

    def verify(self, name: str) -> Path:
        if name not in self.names:
            raise HostError(f"netns {name}: missing")
        return Path("/run/netns") / name

    def delete(self, name: str) -> None:
        self._call("netns.delete", name)
        self.names.discard(name)

    def list_names(self, prefix: str) -> list[str]:
        return sorted(n for n in self.names if n.startswith(prefix))


class FakeControl(_Recording):
    """``ControlPlane``: an opened session's agent says hello at once; one ``silent`` names
    never does (the caller's timeout ends the wait, or the session's close, as with the real
    one); ``drop(sid)`` ends its connection as a dying sandbox would, and ``reconnect(sid)``
    brings it back (a new wait for its end begins); while ``hello_gate`` is set and not open,
    every agent waits for it (a reconnect back-off) and is not connected. What ``send``
    reached the agent with is kept in ``delivered`` (sid -> lines). tests/contract/
    test_control.py holds it, these knobs included, and the real ``ControlServer`` to one
    contract."""

    def __init__(self, log: Calls | None = None) -> None:
        super().__init__(log)
        self.open_dirs: set[str] = set()
        self.made_dirs: set[str] = set()  # serving only the claim socket (a pooled sandbox)
        self.woken: set[str] = set()  # pooled sandboxes told of their claim
        self.claim_waiters: set[str] = set()  # pooled sandboxes whose agent waits on claim.sock
        self._claim_lost: list[Callable[[str], None]] = []
        self.silent: set[str] = set()
        self.sent: list[tuple[str, str, int]] = []
        self.delivered: dict[str, list[bytes]] = {}
        self._dropped: dict[str, asyncio.Event] = {}
        self._closed: dict[str, asyncio.Event] = {}
        self._claim_closed: dict[str, asyncio.Event] = {}
        self.listener: ControlListener | None = None
        self.unsettled: Callable[[str], bool] | None = None  # what a clean stop would ask
        self.hello_gate: asyncio.Event | None = None

    async def open_claim(self, sid: str) -> Path:
        self._call("control.open_claim", sid)
        self.made_dirs.add(sid)
        self._claim_closed[sid] = asyncio.Event()
        return Path("/run/ironclaw/sessions") / sid

    async def wait_claim(self, sid: str) -> None:
        """The fake's pooled agent waits on its claim socket at once, unless ``silent``."""
        closed = self._claim_closed.get(sid)
        if closed is None or sid not in self.made_dirs:
            raise HostError(f"session {sid}: claim socket not served")
        if sid in self.silent:  # never connects: only the sandbox's teardown ends the wait
            await closed.wait()
        if closed.is_set():
            raise HostError(f"session {sid}: claim socket closed before its agent connected")
        self.claim_waiters.add(sid)

    def claim_waiting(self, sid: str) -> bool:
        return sid in self.claim_waiters and sid in self.made_dirs

    def on_claim_lost(self, hook: Callable[[str], None]) -> None:
        self._claim_lost.append(hook)

    def lose_claim(self, sid: str) -> None:
        """A waiting pooled agent died: its claim connection ended (not part of the port). As
        with the real one, only an agent still waiting on a served claim socket is a loss."""
        if not self.claim_waiting(sid):
            return
        self.claim_waiters.discard(sid)
        for hook in self._claim_lost:
            hook(sid)

    async def wake(self, sid: str) -> None:
        self._call("control.wake", sid)
        self.woken.add(sid)
        self.claim_waiters.discard(sid)
        closed = self._claim_closed.pop(sid, None)  # the claim socket is no longer served
        if closed is not None:
            closed.set()

    async def open(self, sid: str) -> Path:
        self._call("control.open", sid)
        self.open_dirs.add(sid)
        self._dropped[sid] = asyncio.Event()
        self._closed[sid] = asyncio.Event()
        return Path("/run/ironclaw/sessions") / sid

    async def wait_hello(self, sid: str) -> AgentHello:
        closed = self._require(sid)
        if sid in self.silent:  # never connects: only the session's close ends the wait
            await closed.wait()
        elif self.hello_gate is not None and not self.hello_gate.is_set():
            waits = [asyncio.ensure_future(e.wait()) for e in (self.hello_gate, closed)]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
        if closed.is_set():
            raise HostError(f"session {sid}: control socket closed before its agent said hello")
        return AgentHello(pid=7, uid=10000)

    def _require(self, sid: str) -> asyncio.Event:
        closed = self._closed.get(sid)
        if closed is None or sid not in self.open_dirs:
            raise HostError(f"session {sid}: control socket is not open")
        return closed

    def is_connected(self, sid: str) -> bool:
        """Whether ``send`` would reach the agent (not part of the port): it said hello (it is
        not ``silent``, nor held by a closed ``hello_gate``) and has not been dropped."""
        event = self._dropped.get(sid)
        gated = self.hello_gate is not None and not self.hello_gate.is_set()
        return (
            sid in self.open_dirs
            and sid not in self.silent
            and not gated
            and event is not None
            and not event.is_set()
        )

    async def wait_disconnect(self, sid: str) -> None:
        self._require(sid)
        await self._dropped[sid].wait()

    def connected(self, sid: str) -> bool:
        return self.is_connected(sid)

    async def close(self, sid: str) -> None:
        self._call("control.close", sid)
        self.open_dirs.discard(sid)
        self.made_dirs.discard(sid)
        self.claim_waiters.discard(sid)
        for events in (self._closed, self._dropped, self._claim_closed):  # every wait ends
            event = events.pop(sid, None)
            if event is not None:
                event.set()

    def list_dirs(self) -> list[str]:
        return sorted(self.open_dirs | self.made_dirs)

    def set_listener(self, listener: ControlListener) -> None:
        self.listener = listener

    def set_unsettled(self, check: Callable[[str], bool]) -> None:
        self.unsettled = check

    async def send(self, sid: str, event: str, value: int) -> bool:
        self.sent.append((sid, event, value))
        if not self.is_connected(sid):
            return False
        self.delivered.setdefault(sid, []).append(f"{event} {value}\n".encode("ascii"))
        return True

    def drop(self, sid: str) -> None:
        event = self._dropped.get(sid)
        if event is not None:
            event.set()

    def reconnect(self, sid: str) -> None:
        """The agent connects again and says hello (after ``drop``): a new wait begins."""
        if sid in self.open_dirs and self._dropped[sid].is_set():
            self._dropped[sid] = asyncio.Event()


class FakeRuntime(_Recording):
    """``SandboxRuntime``: a container exists from its argv (its unit's start) until deleted;
    ids are checked as runsc's are. tests/contract/test_runtime.py holds it and the real
    ``RunscRuntime`` to one contract."""

    platform = "fake"

    def __init__(self, log: Calls | None = None) -> None:
        super().__init__(log)
        self.ids: set[str] = set()

    def run_argv(self, bundle: Path, container_id: str) -> list[str]:
        self.ids.add(check_container_id(container_id))
        return ["/usr/bin/runsc", "run", "--bundle", str(bundle), container_id]

    def writable_paths(self) -> tuple[Path, ...]:
        return (Path("/run/ironclaw/runsc"),)

    def delete(self, container_id: str) -> None:
        self._call("runtime.delete", check_container_id(container_id))
        self.ids.discard(container_id)

    def list_ids(self) -> list[str]:
        return sorted(self.ids)


class FakeMounts(_Recording):
    """``MountSources`` over the directories (and other files) the test says exist."""

    def __init__(
        self, existing: Iterable[str] = (), files: Iterable[str] = (), log: Calls | None = None
    ) -> None:
        super().__init__(log)
        self.existing = set(existing)
        self.files = set(files)
        self.frames: set[Path] = set()

    def resolve(self, source: str, allowlist: Iterable[str]) -> str:
        roots = [r.rstrip("/") + "/" for r in allowlist]
        if not roots:
            raise PolicyDenied(
                f"mount source {source}: no host directory can be granted "
                "([gateway] mount_allowlist is empty)"
            )
        if not any(source.startswith(r) for r in roots):
            raise PolicyDenied(f"mount source {source}: not below [gateway] mount_allowlist")
        if source in self.files:
            raise PolicyDenied(f"mount source {source}: not a directory")
        if source not in self.existing:
            raise PolicyDenied(f"mount source {source}: No such file or directory")
        return source

    def make_frame(self, frame: Path, names: Iterable[str]) -> None:
        self._call("mounts.make_frame", frame, tuple(names))
        self.frames.add(frame)

    def remove_frame(self, frame: Path) -> None:
        self._call("mounts.remove_frame", frame)
        self.frames.discard(frame)

    def skill_set(self, skills: Sequence[AgentSkill], root: Path) -> Path:
        self._call("mounts.skill_set", tuple(s.name for s in skills))
        return root / skill_set_digest(skills)


class FakeBundles(_Recording):
    """``Bundles``: written specs kept by directory."""

    def __init__(self, log: Calls | None = None) -> None:
        super().__init__(log)
        self.specs: dict[Path, Mapping[str, Any]] = {}

    def write(
        self, bundle: Path, spec: Mapping[str, Any], granted: Sequence[Mount], state_dir: Path
    ) -> None:
        self._call("bundles.write", bundle)
        check_spec(spec, granted, state_dir)  # what the real writer refuses, this refuses
        self.specs[bundle] = spec

    def remove(self, bundle: Path) -> None:
        self._call("bundles.remove", bundle)
        self.specs.pop(bundle, None)

    def list_names(self, bundles_dir: Path) -> list[str]:
        return sorted(p.name for p in self.specs if p.parent == bundles_dir)


class _Queue:
    def __init__(self) -> None:
        self.rows: list[tuple[str, float, str | None]] = []
        self.closed = False

    def append(self, body: str, created_at: float, client_id: str | None) -> tuple[int, bool]:
        for seq, (_, _, cid) in enumerate(self.rows, 1):
            if client_id and cid == client_id:  # "" is no client id, as in store/queues.py
                return seq, False
        self.rows.append((body, created_at, client_id))
        return len(self.rows), True

    def last_seq(self) -> int:
        return len(self.rows)

    def close(self) -> None:
        self.closed = True


class _Outbound:
    """``OutboundRows`` over a session's list (None: the agent has not made its file yet), as it
    is at each read."""

    def __init__(self, data: FakeSessionData, sid: str) -> None:
        self._data = data
        self._sid = sid

    @property
    def rows(self) -> list[RawRow] | None:
        return self._data.outbound_rows.get(self._sid)

    def read_after(self, after: int, limit: int, max_body: int) -> list[RawRow]:
        return [_capped(r, max_body) for r in self.rows or [] if r[0] > after][:limit]

    def read_range(self, first: int, last: int, max_body: int) -> list[RawRow]:
        if self.rows is None:
            raise HostError("outbound.db does not exist")
        return [_capped(r, max_body) for r in self.rows if first <= r[0] <= last]

    def close(self) -> None:
        pass


def _capped(row: RawRow, max_body: int) -> RawRow:
    """A body over the cap reads as None, as store/outbound.py's."""
    seq, in_reply_to, created_at, body = row
    return seq, in_reply_to, created_at, body if body is None or len(body) <= max_body else None


class FakeSessionData(_Recording):
    """``SessionData``: keys and queues in memory; ``prepared`` holds the sessions whose key is
    on the (fake) tmpfs."""

    def __init__(self, log: Calls | None = None) -> None:
        super().__init__(log)
        self.keys: dict[str, bytes] = {}
        self.prepared: set[str] = set()
        self.pooled: set[str] = set()  # queue dirs and an empty key file, no key
        self.inbound_queues: dict[str, _Queue] = {}
        self.outbound_rows: dict[str, list[RawRow]] = {}
        self.full = False

    def check_space(self, doing: str) -> None:
        if self.full:
            raise DiskFull(f"{doing}: refused: the state directory is below min_free_bytes")

    def key(self, sid: str) -> bytes:
        if sid not in self.keys:
            raise HostError(f"session {sid}: no key (it was destroyed)")
        return self.keys[sid]

    def prepare(self, sid: str, uid: int, gid: int) -> bytes:
        self._call("data.prepare", sid)
        self.keys.setdefault(sid, secrets.token_bytes(32))  # each session its own, as for real
        self.prepared.add(sid)
        return self.keys[sid]

    def prepare_pooled(self, sid: str, uid: int, gid: int) -> None:
        self._call("data.prepare_pooled", sid)
        if sid in self.keys:
            raise HostError(f"refusing to pool {sid}: it has a key (a session owns it)")
        self.pooled.add(sid)

    def seal(self, sid: str, uid: int, gid: int) -> bytes:
        self._call("data.seal", sid)
        if sid in self.keys or sid not in self.pooled:
            raise HostError(f"refusing to seal {sid}")
        self.keys[sid] = secrets.token_bytes(32)
        self.prepared.add(sid)
        return self.keys[sid]

    def list_sids(self) -> list[str]:
        return sorted(self.pooled | set(self.keys))

    def release(self, sid: str) -> None:
        self._call("data.release", sid)
        self.prepared.discard(sid)

    def destroy(self, sid: str) -> None:
        self._call("data.destroy", sid)
        self.prepared.discard(sid)
        self.pooled.discard(sid)
        self.keys.pop(sid, None)
        self.inbound_queues.pop(sid, None)
        self.outbound_rows.pop(sid, None)

    def inbound(self, sid: str, gid: int) -> _Queue:
        self.key(sid)
        return self.inbound_queues.setdefault(sid, _Queue())

    def outbound(self, sid: str, uid: int) -> _Outbound:
        self.key(sid)
        return _Outbound(self, sid)

    def strip_setid(self, sid: str, uid: int) -> int:
        return 0

    def unit_entry(self, sid: str, argv: Sequence[str]) -> tuple[list[str], int | None]:
        return list(argv), None  # the outbound "tmpfs" is a dict here: nothing to hand over


class FakeCredentials:
    """``Credentials`` over a dict."""

    def __init__(self, **secrets: str) -> None:
        self.secrets = secrets
        self.asked: list[str] = []

    def get(self, name: str) -> str:
        self.asked.append(name)
        if name not in self.secrets:
            raise NotFound(f"credential '{name}' not found")
        return self.secrets[name]
