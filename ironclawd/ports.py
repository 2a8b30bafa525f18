"""The small Protocols behind which every host effect sits (docs/style.md §3).

Services receive implementations through their constructors; only ``daemon.py`` picks the real
adapters (``host/``, ``store/``). Fakes for the unit tier live in ``tests/fakes`` and pass the
same contract tests as the real adapters.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def time(self) -> float: ...


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
    extra_properties: Mapping[str, str] = field(default_factory=dict)


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


# Called with (sid, event, value) for what an agent announces: ("outbound", seq).
ControlListener = Callable[[str, str, int], Awaitable[None]]


class ControlPlane(Protocol):
    """Per-session control sockets in /run/ironclaw/sessions/<sid>/ (real: api/control.py)."""

    async def open(self, sid: str) -> Path:
        """Create the session's socket directory and start listening; return the directory."""
        ...

    async def wait_hello(self, sid: str) -> AgentHello:
        """The agent's hello once it connects (the caller bounds the wait)."""
        ...

    async def wait_disconnect(self, sid: str) -> None:
        """Return when the agent's connection drops (not when the daemon closes it)."""
        ...

    async def close(self, sid: str) -> None:
        """Stop listening and remove the session's socket directory (idempotent)."""
        ...

    def list_dirs(self) -> list[str]: ...
    def set_listener(self, listener: ControlListener) -> None: ...
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
    headers: tuple[tuple[str, str], ...]  # sent exactly as given (Host included)
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
