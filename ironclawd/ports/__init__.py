"""The small Protocols behind which every host effect sits (docs/style.md §3).

Services receive implementations through their constructors; only ``daemon.py`` picks the real
adapters (``host/``, ``store/``). Fakes for the unit tier live in ``tests/fakes`` and pass the
same contract tests as the real adapters.
"""

from __future__ import annotations

import threading
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ironclawd.domain.checks import CheckResult
from ironclawd.domain.model import Chunk, Completion
from ironclawd.domain.packages import AgentPackage
from ironclawd.domain.policy import Mount
from ironclawd.domain.session import Session
from ironclawd.domain.skills import AgentSkill
from ironclawd.ports.records import (
    AgentRecords,
    AuditHead,
    AuditLogFile,
    ChangeRecords,
    ReplyRecords,
    SessionKeyRecords,
    SessionRecords,
    VerifyResult,
)

__all__ = [
    "AgentRecords",
    "AuditHead",
    "AuditLogFile",
    "ChangeRecords",
    "ReplyRecords",
    "SessionKeyRecords",
    "SessionRecords",
    "VerifyResult",
]


class Clock(Protocol):
    """The one source of time for services (real: host/clock.py)."""

    def monotonic(self) -> float:
        """For durations and rate windows: never jumps."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch: what is persisted and shown."""
        ...


class SessionLookup(Protocol):
    """Which session a sandbox call came from (real: services/sessions.py)."""

    def get(self, sid: str) -> Session:
        """NotFound for an unknown session."""
        ...


# -- host effects besides units, netns, runtime and sockets -----------------------------------


class Credentials(Protocol):
    """Upstream secrets by name (real: store/credentials.py)."""

    def get(self, name: str) -> str:
        """NotFound (naming the credential, never its value) if it is not there."""
        ...


class MountSources(Protocol):
    """Host directories an agent may have mounted (real: host/mounts.py)."""

    def resolve(self, source: str, allowlist: Iterable[str]) -> str:
        """The real path of ``source``; PolicyDenied unless it lies under the allowlist."""
        ...

    def make_frame(self, frame: Path, names: Iterable[str]) -> None: ...
    def remove_frame(self, frame: Path) -> None: ...
    def skill_set(self, skills: Sequence[AgentSkill], root: Path) -> Path:
        """The immutable directory under ``root`` holding ``skills``' files, written if absent;
        SandboxError if a file does not match its hash."""
        ...


class TrustedKeys(Protocol):
    """The minisign public keys the operator trusts to sign skills (real: host/skill_keys.py)."""

    def read(self) -> Mapping[str, str]:
        """Each key file's name and text, read afresh (a key added or removed counts at once)."""
        ...


class PackageImages(Protocol):
    """Agents' Debian packages and the images holding them (real: bundle/packages.py)."""

    @property
    def base(self) -> Path:
        """The shared base image (never modified)."""
        ...

    def resolve(self, names: Sequence[str]) -> tuple[AgentPackage, ...]:
        """What installing ``names`` on the base unpacks, dependencies included; PolicyDenied
        for a refused package (naming what pulled it in), InvalidArgument for an unknown one."""
        ...

    def image(self, packages: Sequence[AgentPackage]) -> Path:
        """The image holding exactly ``packages`` (the base when there are none), built if
        absent; SignatureMismatch if a ``.deb`` differs from its approved hash (nothing is
        unpacked then), SandboxError if it cannot be built."""
        ...

    def collect(self, keep: Iterable[Sequence[AgentPackage]], in_use: Iterable[str]) -> list[str]:
        """Remove the images that no package set in ``keep`` and no path in ``in_use`` names;
        the names removed."""
        ...


class Bundles(Protocol):
    """OCI bundle directories (real: bundle/writer.py)."""

    def write(
        self, bundle: Path, spec: Mapping[str, Any], granted: Sequence[Mount], state_dir: Path
    ) -> None: ...
    def remove(self, bundle: Path) -> None:
        """Remove a bundle directory (or a symlink planted in its place); nothing if absent."""
        ...

    def list_names(self, bundles_dir: Path) -> list[str]: ...


class InboundQueue(Protocol):
    """A session's inbound queue file, written by the host (real: store/queues.py)."""

    def append(self, body: str, created_at: float, client_id: str | None) -> tuple[int, bool]:
        """(seq, new): an existing client_id returns its earlier seq and False."""
        ...

    def last_seq(self) -> int: ...
    def close(self) -> None: ...


RawRow = tuple[int, object, object, bytes | None]  # (seq, in_reply_to, created_at, body) as read


class OutboundRows(Protocol):
    """A session's outbound queue file, written by its (hostile) agent (real: store/outbound.py)."""

    def read_after(self, after: int, limit: int, max_body: int) -> list[RawRow]: ...
    def read_range(self, first: int, last: int, max_body: int) -> list[RawRow]: ...
    def close(self) -> None:
        """Let go of what the reader keeps between reads (it may be used again)."""
        ...


class MountSpace(Protocol):
    """Where the sessions' outbound tmpfs are mounted: a mount namespace of the daemon's own,
    so that no sandbox unit copies them (real: host/mountns.py)."""

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` where paths are the namespace's (mount, unmount, make directories)."""
        ...

    def view(self, path: Path) -> Path:
        """``path`` as the namespace sees it, for the daemon's other threads (never SQLite)."""
        ...

    def clone(self, path: Path) -> int:
        """A detached clone (a descriptor, close-on-exec) of the mount at ``path``."""
        ...

    def exec_argv(self, target: Path, argv: Sequence[str]) -> list[str]:
        """A unit command line that mounts its standard input on ``target``, then runs argv."""
        ...

    def health(self) -> tuple[bool, str]:
        """Whether the namespace in use is the one pinned for the next start, and what was
        seen (``ironctl doctor``)."""
        ...


class SessionData(Protocol):
    """A session's key and queues (real: store/session_data.py)."""

    def check_space(self, doing: str) -> None:
        """DiskFull while the state filesystem is below ``daemon.min_free_bytes``."""
        ...

    def key(self, sid: str) -> bytes: ...
    def prepare(self, sid: str, uid: int, gid: int) -> bytes:
        """Make the key and queue dirs if missing; put the key on tmpfs for the box."""
        ...

    def prepare_pooled(self, sid: str, uid: int, gid: int) -> None:
        """A pooled sandbox's mount sources: empty queue dirs and key file, no key."""
        ...

    def seal(self, sid: str, uid: int, gid: int) -> bytes:
        """Make ``sid``'s key (it must have none) and write it into the pooled placeholder."""
        ...

    def list_sids(self) -> list[str]:
        """Session ids that have queue directories."""
        ...

    def release(self, sid: str) -> None:
        """Take the unwrapped key off tmpfs."""
        ...

    def destroy(self, sid: str) -> None:
        """Forget the key for good, then delete the queue files."""
        ...

    def inbound(self, sid: str, gid: int) -> InboundQueue: ...
    def outbound(self, sid: str, uid: int) -> OutboundRows: ...
    def strip_setid(self, sid: str, uid: int) -> int: ...
    def unit_entry(self, sid: str, argv: Sequence[str]) -> tuple[list[str], int | None]:
        """The sandbox unit's command line for ``sid`` and the descriptor (or None) systemd
        hands it as standard input: the session's outbound tmpfs, when it lives in the
        daemon's mount namespace (``MountSpace``). The caller closes the descriptor."""
        ...


class Provider(Protocol):
    """A model API (real: providers/)."""

    name: str

    def stream(self, completion: Completion, key: str, base_url: str) -> AsyncIterator[Chunk]: ...


@dataclass(frozen=True)
class RunscCheck:
    result: CheckResult
    platforms: tuple[str, ...]  # what the runsc found offers; () if none was found


class HostProbes(Protocol):
    """What ``doctor`` tries on the host (real: host/probes.py, store/probes.py)."""

    def runsc(self, runsc: Path) -> RunscCheck: ...
    def systemd(self) -> CheckResult: ...
    def cgroups(self) -> CheckResult: ...
    def sqlcipher(self) -> CheckResult: ...
    def platform(self, units: UnitManager, runsc: Path, platform: str) -> CheckResult: ...


@dataclass(frozen=True)
class UnitSpec:
    """What a transient sandbox unit runs and the limits that bind it."""

    name: str  # e.g. "ironclaw-sbx-<sid>.service"
    argv: Sequence[str]  # never holds a secret: argv is readable over D-Bus and in ps
    description: str
    netns_path: Path | None  # None: a fresh namespace of systemd's (PrivateNetwork=, lo only)
    slice: str = "ironclaw.slice"
    memory_max_bytes: int = 512 * 1024 * 1024
    tasks_max: int = 256
    cpu_quota_percent: int = 100
    working_directory: Path = Path("/")
    # inactive-or-failed: a dead unit vanishes at once, so a restarted session can reuse its
    # name; its result is then only seen by wait_inactive() (which pins the unit) or the journal.
    collect_mode: str = "inactive-or-failed"
    stop_timeout_seconds: float = 10.0  # TimeoutStopUSec: SIGTERM to runsc, then SIGKILL to all
    # The only host paths the unit may write (ProtectSystem=strict + ReadWritePaths=).
    writable_paths: Sequence[Path] = ()
    # Host directories runsc only reads (read-only grants): one below /home needs the unit's
    # ProtectHome= to leave home directories visible (read-only), as a writable one does.
    readonly_paths: Sequence[Path] = ()
    extra_properties: Mapping[str, str] = field(default_factory=dict)
    # Standard input of the unit's process (systemd duplicates it; the caller closes it).
    stdin_fd: int | None = None


@dataclass(frozen=True)
class UnitState:
    name: str
    active_state: str  # active, activating, deactivating, inactive, failed
    sub_state: str
    main_pid: int
    result: str  # success, oom-kill, exit-code, signal, timeout ...


class UnitManager(Protocol):
    """Transient systemd units for sandboxes (real adapter: host/systemd.py, pystemd)."""

    def start_transient(self, spec: UnitSpec, timeout: float) -> UnitState: ...
    def stop(self, name: str, timeout: float) -> None: ...
    def list_units(self, pattern: str) -> list[UnitState]: ...
    def reset_failed(self, name: str) -> None: ...
    def wait_inactive(self, name: str, timeout: float) -> UnitState | None:
        """Block until the unit is inactive or failed and return its last state (None: gone)."""
        ...


class NetnsManager(Protocol):
    """Empty network namespaces under /run/netns (real adapter: host/netns.py, pyroute2)."""

    def create(self, name: str) -> Path: ...
    def verify(self, name: str) -> Path: ...
    def delete(self, name: str) -> None: ...
    def list_names(self, prefix: str) -> list[str]: ...


@dataclass(frozen=True)
class AgentHello:
    """What the in-box agent said when it connected to its session's control socket."""

    pid: int
    uid: int
    outbound_seq: int = 0  # the newest outbound row the agent has committed
    # The version of the protocol it speaks (domain/agent_protocol.py); 1 if it named none.
    protocol: int = 1


# Called with (sid, event, value) for what an agent announces: ("outbound", seq); and with
# (sid, RESYNC, 0) when a connection comes back from systemd's fd store after a daemon restart
# (what the old daemon had read but not acted on is lost: read the agent's queue again in full).
RESYNC = "resync"
ControlListener = Callable[[str, str, int], Awaitable[None]]


class ControlPlane(Protocol):
    """Per-session control sockets in /run/ironclaw/sessions/<sid>/ (real: api/control.py)."""

    async def open(self, sid: str) -> Path:
        """Create the session's socket directory and start listening; return the directory."""
        ...

    async def open_claim(self, sid: str) -> Path:
        """A pooled sandbox: create the socket directory serving only the socket its agent
        waits on until ``wake``; return the directory."""
        ...

    def claim_waiting(self, sid: str) -> bool:
        """Whether a pooled sandbox's agent is connected to its claim socket now (only the
        sandbox's own processes are let in, and the connection ends with the agent)."""
        ...

    async def wait_claim(self, sid: str) -> None:
        """Return once a pooled sandbox's agent waits on its claim socket (the caller bounds
        the wait): only then can a claim wake it at once. HostError if ``sid`` serves no claim
        socket, or stops serving it first (a teardown)."""
        ...

    def on_claim_lost(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(sid)`` when a pooled sandbox's waiting agent's connection ends from
        its side before a claim (the agent died)."""
        ...

    async def wake(self, sid: str) -> None:
        """Tell a pooled sandbox's waiting agent it was claimed (after ``open``, once its key
        and sockets are in place) and stop serving its claim socket; no-op if not pooled."""
        ...

    async def wait_hello(self, sid: str) -> AgentHello:
        """The agent's hello once it connects (the caller bounds the wait). HostError if the
        session's socket is not open, or is closed before the hello, or its agent speaks a
        protocol version this daemon does not (domain/agent_protocol.py: the error says why)."""
        ...

    async def wait_disconnect(self, sid: str) -> None:
        """Return when the agent's last connection ends, or the session is closed. HostError
        if the session's socket is not open. A connection that says hello after that starts
        a new wait."""
        ...

    def connected(self, sid: str) -> bool:
        """Whether a connection of the session's agent that said hello is open now."""
        ...

    async def close(self, sid: str) -> None:
        """Stop listening and remove the session's socket directory (idempotent)."""
        ...

    def list_dirs(self) -> list[str]: ...
    def set_listener(self, listener: ControlListener) -> None: ...
    def set_unsettled(self, check: Callable[[str], bool]) -> None:
        """``check(sid)``: whether the session's agent announced replies that were not all
        taken (held at a bound, or a failed ingest being retried). At a clean stop such a
        session's connection is handed over marked, and the next daemon reads its outbound
        queue in full (RESYNC): the agent announces each reply once."""
        ...

    async def send(self, sid: str, event: str, value: int) -> bool:
        """Tell the agent something ("inbound", seq); False if it is not connected."""
        ...


class SandboxRuntime(Protocol):
    """The OCI runtime (real: host/runtime.py, runsc)."""

    @property
    def platform(self) -> str: ...
    def run_argv(self, bundle: Path, container_id: str) -> list[str]: ...
    def writable_paths(self) -> tuple[Path, ...]:
        """Host paths the runtime writes besides a session's own mounts (its state)."""
        ...

    def delete(self, container_id: str) -> None: ...
    def list_ids(self) -> list[str]: ...


@dataclass(frozen=True)
class LogLine:
    timestamp: float
    message: str
    source: str


class JournalReader(Protocol):
    """A unit's journal (real: host/journal.py)."""

    def tail(self, unit: str, lines: int) -> list[LogLine]: ...
    def follow(self, unit: str, stop: threading.Event) -> Iterator[LogLine]: ...


class SandboxSockets(Protocol):
    """The sandbox-facing API sockets of a session (real: api/sandbox.py)."""

    async def open(self, sid: str) -> None: ...
    async def close(self, sid: str) -> None: ...


class AuditSink(Protocol):
    """Where gateway transitions, session lifecycle, model calls and egress decisions are
    recorded (real: services/audit.py over store/audit.py)."""

    def record(self, event: str, actor: str, **fields: object) -> None:
        """Append and fsync before returning."""
        ...

    def record_soon(self, event: str, actor: str, **fields: object) -> None:
        """Queue for a group commit (hot paths); durable within milliseconds."""
        ...


class Resolver(Protocol):
    """Name resolution for the egress broker (real: net/resolver.py). The broker validates every
    address this returns and connects only to one of them: it never resolves a name twice."""

    async def resolve(self, host: str, port: int) -> list[str]: ...


@dataclass(frozen=True)
class UpstreamRequest:
    """One request to an address the broker already validated. ``host`` is what the TLS
    certificate must name and what SNI carries; ``address`` is the only place connected to."""

    scheme: str
    host: str
    address: str
    port: int
    method: str
    target: str  # path and query
    # Sent exactly as given (Host included); repr=False: an injected credential is one of them.
    headers: tuple[tuple[str, str], ...] = field(repr=False)
    body: bytes
    connect_timeout: float


class UpstreamResponse(Protocol):
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]

    async def read_chunk(self) -> bytes:
        """The next piece of the body, b"" at its end."""
        ...

    async def close(self) -> None: ...


class Upstream(Protocol):
    """HTTP(S) to a pinned address (real: net/http.py)."""

    async def send(self, request: UpstreamRequest) -> UpstreamResponse: ...
