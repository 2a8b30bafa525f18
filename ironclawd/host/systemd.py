"""Transient sandbox units over D-Bus with pystemd (docs/architecture.md §3 "Unit").

Every public call opens its own bus connection and closes it before returning: sd-bus objects are
not thread-safe and the daemon calls these from worker threads; a connection costs about a
millisecond, and a ``Subscribe()`` ends with the connection that made it.

Waiting for a job follows sd-bus's event-loop contract (sd_bus_process(3)): call ``process()``
until it has nothing left, then ``select()`` on the bus fd. pystemd's ``process()`` hides the
return value, so "nothing left" is detected as: no callback ran and no unhandled message came
back. ``select()`` is bounded by a short tick anyway, so that a message already buffered inside
sd-bus (which leaves the fd unreadable) can delay us by one tick at most, never hang us.

pystemd is imported at the first D-Bus call (``_dbus()``), not with this module: its package
imports all of itself (its object layer, lxml, ...), ~10 ms of the daemon's start (~24 ms in a
bare interpreter), and a start with nothing to adopt makes no D-Bus call before READY (issue 17).
"""

from __future__ import annotations

import functools
import select
import time
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, Final

from ironclawd import lazy_re
from ironclawd.errors import HostError, InvalidArgument
from ironclawd.host import hardening
from ironclawd.ports import UnitSpec, UnitState

_DEST: Final = b"org.freedesktop.systemd1"
_PATH: Final = b"/org/freedesktop/systemd1"
_MANAGER: Final = b"org.freedesktop.systemd1.Manager"
_UNIT: Final = b"org.freedesktop.systemd1.Unit"
_SERVICE: Final = b"org.freedesktop.systemd1.Service"
_PROPERTIES: Final = b"org.freedesktop.DBus.Properties"
_TICK: Final = 0.25  # seconds; see the module docstring
_MAX_DRAIN: Final = 1024  # process() calls per wake-up; a bound, never reached in practice

# D-Bus signatures of the unit properties we send (systemd: src/core/dbus-*.c). Ours, so that
# pystemd's global table (which lacks NetworkNamespacePath) is neither needed nor patched.
PROPERTY_SIGNATURES: Final[dict[str, str]] = {
    "Description": "s",
    "ExecStart": "a(sasb)",
    "Type": "s",
    "Slice": "s",
    "WorkingDirectory": "s",
    "NetworkNamespacePath": "s",
    "MemoryMax": "t",
    "MemorySwapMax": "t",
    "TasksMax": "t",
    "CPUQuotaPerSecUSec": "t",
    "CollectMode": "s",
    "KillMode": "s",
    "TimeoutStopUSec": "t",
    "StandardOutput": "s",
    "StandardError": "s",
    "SyslogIdentifier": "s",
    "OOMPolicy": "s",
    "RuntimeMaxUSec": "t",
    "StandardInputFileDescriptor": "h",
    **hardening.SIGNATURES,
}
_UNIT_NAME_RE = lazy_re.compile(r"^[A-Za-z0-9:_.\\-]{1,200}\.service$")
_UNIT_PATTERN_RE = lazy_re.compile(r"^[A-Za-z0-9:_.\\*?\[\]-]{1,200}$")
# A tripwire, not a guarantee: argv is world-readable (ps, D-Bus), so refuse what looks like a
# credential handed over on the command line. Secrets reach the sandbox as mounted files.
_SECRET_RE = lazy_re.compile(
    r"(?i)(secret|passw(or)?d|token|api[_-]?key|private[_-]?key|credential)[^/]*[=:]\S"
    r"|^(sk|xox[abp]|ghp|glpat)-[A-Za-z0-9_-]{16,}"
)

Property = hardening.Property


@functools.cache
def _dbus() -> Any:
    """pystemd's bus and errors (pystemd has no type stubs: Any either way)."""
    from pystemd import dbusexc, dbuslib  # noqa: PLC0415 (at the first call: module docstring)

    return types.SimpleNamespace(
        DBus=dbuslib.DBus,
        apply_signature=dbuslib.apply_signature,
        Error=dbusexc.DBusBaseError,
        NoSuchUnit=dbusexc.DBusNoSuchUnitError,
        UnknownObject=dbusexc.DBusUnknownObjectError,
    )


def _system_bus() -> Any:
    return _dbus().DBus()


def _check_spec(spec: UnitSpec) -> None:
    if not _UNIT_NAME_RE.fullmatch(spec.name):
        raise InvalidArgument(f"unit name {spec.name!r}: expected a .service name")
    if not spec.argv or not spec.argv[0].startswith("/"):
        raise InvalidArgument(f"unit {spec.name}: argv: expected an absolute executable path")
    for arg in spec.argv:
        if _SECRET_RE.search(arg):
            raise InvalidArgument(f"unit {spec.name}: argv: refusing what looks like a secret")
    if spec.netns_path is not None and not spec.netns_path.is_absolute():
        raise InvalidArgument(f"unit {spec.name}: netns_path: expected an absolute path")
    for field, value in (
        ("memory_max_bytes", spec.memory_max_bytes),
        ("tasks_max", spec.tasks_max),
        ("cpu_quota_percent", spec.cpu_quota_percent),
        ("stop_timeout_seconds", spec.stop_timeout_seconds),
    ):
        if value <= 0:
            raise InvalidArgument(f"unit {spec.name}: {field}: expected a positive value")


def _parse_extra(unit: str, name: str, text: str) -> Property:
    sig = PROPERTY_SIGNATURES.get(name)
    if sig is None or sig not in ("s", "t"):
        raise InvalidArgument(f"unit {unit}: extra property {name}: not an allowed property")
    if sig == "s":
        return (name, sig, text)
    if not text.isdigit():
        raise InvalidArgument(f"unit {unit}: extra property {name}: expected an integer")
    return (name, sig, int(text))


def build_properties(spec: UnitSpec) -> list[Property]:
    """The (name, D-Bus signature, value) list that StartTransientUnit gets for ``spec``."""
    _check_spec(spec)
    props: list[Property] = [
        ("Description", "s", spec.description),
        ("ExecStart", "a(sasb)", [(spec.argv[0], list(spec.argv), False)]),
        # exec: the start job fails when execve() fails, instead of "done" then a dead unit.
        ("Type", "s", "exec"),
        ("Slice", "s", spec.slice),
        ("WorkingDirectory", "s", str(spec.working_directory)),
        ("MemoryMax", "t", spec.memory_max_bytes),
        ("MemorySwapMax", "t", 0),  # swap must not stretch MemoryMax (cgroup v2 only)
        ("TasksMax", "t", spec.tasks_max),
        ("CPUQuotaPerSecUSec", "t", spec.cpu_quota_percent * 10_000),
        ("CollectMode", "s", spec.collect_mode),
        # mixed: SIGTERM to runsc alone (it tears its sandbox down), SIGKILL to all on timeout.
        ("KillMode", "s", "mixed"),
        ("TimeoutStopUSec", "t", int(spec.stop_timeout_seconds * 1_000_000)),
        ("StandardOutput", "s", "journal"),
        ("StandardError", "s", "journal"),
        # Never the host's network: systemd joins NetworkNamespacePath= when it is set (it is
        # opened before PrivateNetwork= would make a namespace), else makes a fresh one.
        ("PrivateNetwork", "b", True),
        *hardening.sandbox_properties(
            [str(p) for p in spec.writable_paths], [str(p) for p in spec.readonly_paths]
        ),
    ]
    if spec.netns_path is not None:
        # runsc ignores the spec's netns path with --network=none (docs/development.md, runsc):
        # start the whole runsc process tree inside the empty namespace instead.
        props.append(("NetworkNamespacePath", "s", str(spec.netns_path)))
    if spec.stdin_fd is not None:  # StandardInput=fd follows; systemd keeps a duplicate
        props.append(("StandardInputFileDescriptor", "h", spec.stdin_fd))
    seen = {name for name, _, _ in props}
    for name, text in sorted(spec.extra_properties.items()):
        if name in seen:
            raise InvalidArgument(f"unit {spec.name}: extra property {name}: set by the spec")
        props.append(_parse_extra(spec.name, name, text))
    return props


def encode_properties(props: Sequence[Property]) -> list[tuple[int, Any]]:
    """pystemd's pre-typed argument list for an ``a(sv)`` of ``props``."""
    args: list[tuple[int, Any]] = [(ord("a"), b"(sv)")]
    for name, sig, value in props:
        args += [(ord("r"), b"sv"), (ord("s"), name.encode()), (ord("v"), sig.encode())]
        args += _dbus().apply_signature(sig.encode(), [value])
        args += [(-1, None), (-1, None)]
    args.append((-1, None))
    return args


def start_transient_args(name: str, props: Sequence[Property]) -> list[tuple[int, Any]]:
    """Arguments of StartTransientUnit(s name, s mode, a(sv) props, a(sa(sv)) aux)."""
    # mode "fail": refuse to queue if it would conflict with a job already queued for the unit.
    args = _dbus().apply_signature(b"ss", [name.encode(), b"fail"])
    return [*args, *encode_properties(props), (ord("a"), b"(sa(sv))"), (-1, None)]


def _err(exc: Any) -> str:
    return exc.err_message or exc.err_name or str(exc)


class _Bus:
    """One connection, with a JobRemoved watch whose callback stays referenced while open."""

    def __init__(self, bus: Any) -> None:
        self.bus = bus
        self.jobs: dict[bytes, bytes] = {}
        self.events = 0
        self._callbacks: list[Callable[..., None]] = []  # pystemd keeps only a borrowed pointer

    def call(self, method: bytes, args: list[tuple[int, Any]]) -> Any:
        return self.bus.call_method(_DEST, _PATH, _MANAGER, method, args).body

    def watch_jobs(self) -> None:
        def on_job_removed(msg: Any, error: Any = None, userdata: Any = None) -> None:
            msg.process_reply(False)
            _id, job, _unit, result = msg.body
            self.jobs[bytes(job)] = bytes(result)
            self.events += 1

        self._watch(_PATH, _MANAGER, b"JobRemoved", on_job_removed)
        self.call(b"Subscribe", [])

    def watch_unit(self, unit_path: bytes) -> None:
        def on_change(msg: Any, error: Any = None, userdata: Any = None) -> None:
            self.events += 1

        self._watch(unit_path, _PROPERTIES, b"PropertiesChanged", on_change)
        self.call(b"Subscribe", [])

    def _watch(self, path: bytes, iface: bytes, member: bytes, cb: Callable[..., None]) -> None:
        self._callbacks.append(cb)
        self.bus.match_signal(_DEST, path, iface, member, cb)

    def drain(self) -> None:
        for _ in range(_MAX_DRAIN):
            before = self.events
            msg = self.bus.process()
            if self.events == before and msg.is_empty():
                return

    def wait(self, done: Callable[[], bool], deadline: float) -> bool:
        """Process messages until ``done()`` or the deadline; return ``done()``."""
        # poll(2), not select(2): the daemon holds ~4 descriptors per session, and past ~250
        # sessions a new bus connection's number is above FD_SETSIZE (1024), where select()
        # raises "filedescriptor out of range" (every create failed there, issue 17).
        poller = select.poll()
        poller.register(self.bus.get_fd(), select.POLLIN)
        while True:
            self.drain()
            if done():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            poller.poll(min(remaining, _TICK) * 1000)


class SystemdUnitManager:
    """UnitManager over the system bus (or whatever ``bus_factory`` opens)."""

    def __init__(self, bus_factory: Callable[[], Any] = _system_bus) -> None:
        self._bus_factory = bus_factory

    @contextmanager
    def _open(self, what: str) -> Iterator[_Bus]:
        try:
            with self._bus_factory() as bus:
                yield _Bus(bus)
        except _dbus().Error as exc:
            raise HostError(f"{what}: {_err(exc)}") from exc

    def start_transient(self, spec: UnitSpec, timeout: float) -> UnitState:
        """Start ``spec`` as a transient unit and wait for its start job; HostError unless done."""
        what = f"starting unit {spec.name}"
        args = start_transient_args(spec.name, build_properties(spec))
        deadline = time.monotonic() + timeout
        with self._open(what) as b:
            b.watch_jobs()
            job = bytes(b.call(b"StartTransientUnit", args))
            if not b.wait(lambda: job in b.jobs, deadline):
                _stop_quietly(b, spec.name)
                raise HostError(f"{what}: job did not finish within {timeout:g}s (cancelled)")
            result = b.jobs[job].decode()
            if result != "done":
                raise HostError(f"{what}: job failed: {result}")
            state = _state(b, spec.name)
        # Already gone: the process exited and CollectMode dropped the unit.
        return state or UnitState(spec.name, "inactive", "dead", 0, "")

    def stop(self, name: str, timeout: float) -> None:
        """Stop the unit and wait for the stop job; a unit that is not loaded is already stopped."""
        what = f"stopping unit {name}"
        deadline = time.monotonic() + timeout
        with self._open(what) as b:
            b.watch_jobs()
            try:
                job = bytes(
                    b.call(b"StopUnit", _dbus().apply_signature(b"ss", [name.encode(), b"replace"]))
                )
            except _dbus().NoSuchUnit:
                return
            if not b.wait(lambda: job in b.jobs, deadline):
                raise HostError(f"{what}: job did not finish within {timeout:g}s")
            result = b.jobs[job].decode()
            if result != "done":
                raise HostError(f"{what}: job failed: {result}")

    def state(self, name: str) -> UnitState | None:
        """The unit's current state, or None when it is not loaded."""
        with self._open(f"reading unit {name}") as b:
            return _state(b, name)

    def list_units(self, pattern: str) -> list[UnitState]:
        """Loaded units whose names match the glob ``pattern``."""
        if not _UNIT_PATTERN_RE.fullmatch(pattern):
            raise InvalidArgument(f"unit pattern {pattern!r}: expected a unit-name glob")
        with self._open(f"listing units {pattern}") as b:
            rows = b.call(b"ListUnitsByPatterns", _dbus().apply_signature(b"asas", [[], [pattern]]))
            states = [_state(b, bytes(row[0]).decode()) for row in rows or []]
        return sorted((s for s in states if s is not None), key=lambda s: s.name)

    def reset_failed(self, name: str) -> None:
        """Forget a failed unit's state; a unit that is not loaded is not an error."""
        with self._open(f"resetting unit {name}") as b:
            try:
                b.call(b"ResetFailedUnit", _dbus().apply_signature(b"s", [name.encode()]))
            except _dbus().NoSuchUnit:
                return

    def wait_inactive(self, name: str, timeout: float) -> UnitState | None:
        """Block until the unit is inactive or failed; its final state, or None if already gone.

        The unit is pinned with Unit.Ref() while we wait, so that CollectMode cannot drop it
        before its Result (e.g. ``oom-kill``) has been read.
        """
        what = f"waiting for unit {name}"
        deadline = time.monotonic() + timeout
        with self._open(what) as b:
            path = _unit_path(b, name)
            if path is None:
                return None
            b.watch_unit(path)
            try:
                b.bus.call_method(_DEST, path, _UNIT, b"Ref", [])
            except (_dbus().NoSuchUnit, _dbus().UnknownObject):
                return None
            last: list[UnitState | None] = [None]

            def finished() -> bool:
                last[0] = _state(b, name)
                return last[0] is None or last[0].active_state in ("inactive", "failed")

            if not b.wait(finished, deadline):
                raise HostError(f"{what}: still {_active(last[0])} after {timeout:g}s")
            return last[0]


def _active(state: UnitState | None) -> str:
    return "gone" if state is None else state.active_state


def _unit_path(b: _Bus, name: str) -> bytes | None:
    try:
        return bytes(b.call(b"GetUnit", _dbus().apply_signature(b"s", [name.encode()])))
    except _dbus().NoSuchUnit:
        return None


def _state(b: _Bus, name: str) -> UnitState | None:
    path = _unit_path(b, name)
    if path is None:
        return None

    def prop(iface: bytes, prop: bytes, sig: bytes) -> Any:
        return b.bus.get_property(_DEST, path, iface, prop, sig)

    try:
        active = bytes(prop(_UNIT, b"ActiveState", b"s")).decode()
        sub = bytes(prop(_UNIT, b"SubState", b"s")).decode()
        if not name.endswith(".service"):
            return UnitState(name, active, sub, 0, "")
        pid = int(prop(_SERVICE, b"MainPID", b"u"))
        result = bytes(prop(_SERVICE, b"Result", b"s")).decode()
    except (_dbus().NoSuchUnit, _dbus().UnknownObject):
        return None  # collected between GetUnit and the property reads
    return UnitState(name, active, sub, pid, result)


def _stop_quietly(b: _Bus, name: str) -> None:
    # Best effort after a start timed out: a "replace" stop job cancels the pending start job.
    with suppress(_dbus().Error):
        b.call(b"StopUnit", _dbus().apply_signature(b"ss", [name.encode(), b"replace"]))
