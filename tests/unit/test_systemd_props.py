"""Unit properties and the job wait of host/systemd.py, against a fake bus (no D-Bus)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pystemd.dbusexc import DBusNoSuchUnitError

from ironclawd.errors import HostError, InvalidArgument
from ironclawd.host import hardening, systemd
from ironclawd.host.systemd import SystemdUnitManager, build_properties, start_transient_args
from ironclawd.ports import UnitSpec

SPEC = UnitSpec(
    name="ironclaw-sbx-ab12.service",
    argv=["/usr/bin/runsc", "--root=/run/ironclaw/runsc", "--network=none", "run", "x"],
    description="IronClaw sandbox ab12",
    netns_path=Path("/run/netns/ironclaw-ab12"),
    memory_max_bytes=64 << 20,
    tasks_max=100,
    cpu_quota_percent=150,
    stop_timeout_seconds=7.5,
)


def props(spec: UnitSpec = SPEC) -> dict[str, tuple[str, Any]]:
    return {name: (sig, value) for name, sig, value in build_properties(spec)}


def test_limits_and_netns_are_set() -> None:
    p = props()
    assert p["MemoryMax"] == ("t", 64 << 20)
    assert p["MemorySwapMax"] == ("t", 0)
    assert p["TasksMax"] == ("t", 100)
    assert p["CPUQuotaPerSecUSec"] == ("t", 1_500_000)  # 150 % = 1.5 s of CPU per second
    assert p["NetworkNamespacePath"] == ("s", "/run/netns/ironclaw-ab12")
    assert p["Slice"] == ("s", "ironclaw.slice")
    assert p["TimeoutStopUSec"] == ("t", 7_500_000)


def test_collection_kill_and_start_semantics() -> None:
    p = props()
    assert p["CollectMode"] == ("s", "inactive-or-failed")
    assert p["KillMode"] == ("s", "mixed")
    assert p["Type"] == ("s", "exec")
    assert p["StandardOutput"] == ("s", "journal")
    assert p["ExecStart"] == ("a(sasb)", [("/usr/bin/runsc", list(SPEC.argv), False)])
    assert "Environment" not in p  # nothing secret can travel in the unit's environment
    assert props(replace(SPEC, collect_mode="inactive"))["CollectMode"] == ("s", "inactive")


def test_every_property_has_a_known_signature() -> None:
    for name, sig, _ in build_properties(SPEC):
        assert systemd.PROPERTY_SIGNATURES[name] == sig


def test_encoded_arguments_are_well_nested() -> None:
    args = start_transient_args(SPEC.name, build_properties(SPEC))
    assert args[:2] == [(ord("s"), SPEC.name.encode()), (ord("s"), b"fail")]
    depth = 0
    for kind, _ in args:
        if kind in (ord("a"), ord("r"), ord("v")):
            depth += 1
        elif kind == -1:
            depth -= 1
        assert depth >= 0
    assert depth == 0
    flat = [v for _, v in args]
    assert b"NetworkNamespacePath" in flat
    assert flat[flat.index(b"NetworkNamespacePath") + 1] == b"s"  # the variant's signature


def test_extra_properties_are_allowlisted_and_typed() -> None:
    p = props(replace(SPEC, extra_properties={"RuntimeMaxUSec": "60000000", "OOMPolicy": "kill"}))
    assert p["RuntimeMaxUSec"] == ("t", 60_000_000)
    assert p["OOMPolicy"] == ("s", "kill")
    for extra, match in [
        ({"ExecStartPre": "/bin/sh"}, "not an allowed property"),
        ({"Environment": "KEY=x"}, "not an allowed property"),
        ({"MemoryMax": "1"}, "set by the spec"),
        ({"RuntimeMaxUSec": "1h"}, "expected an integer"),
    ]:
        with pytest.raises(InvalidArgument, match=match):
            build_properties(replace(SPEC, extra_properties=extra))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"name": "ironclaw-sbx-ab12"}, "expected a .service name"),
        ({"name": "../x.service"}, "expected a .service name"),
        ({"argv": []}, "absolute executable"),
        ({"argv": ["runsc", "run"]}, "absolute executable"),
        ({"argv": ["/usr/bin/x", "--api-key=sk-abc"]}, "looks like a secret"),
        ({"argv": ["/usr/bin/x", "sk-ant0123456789abcdefXYZ"]}, "looks like a secret"),
        ({"argv": ["/usr/bin/x", "PASSWORD=hunter2"]}, "looks like a secret"),
        ({"netns_path": Path("run/netns/x")}, "netns_path"),
        ({"memory_max_bytes": 0}, "memory_max_bytes"),
        ({"cpu_quota_percent": -1}, "cpu_quota_percent"),
    ],
)
def test_bad_specs_are_refused_with_the_field_named(change: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        build_properties(replace(SPEC, **change))


def test_paths_with_key_words_are_not_secrets() -> None:
    build_properties(replace(SPEC, argv=["/usr/bin/runsc", "--root=/run/ironclaw/keys/ab12"]))


class FakeMsg:
    def __init__(self, body: Any = None) -> None:
        self.body = body

    def process_reply(self, with_headers: bool) -> None:
        pass

    def is_empty(self) -> bool:
        return self.body is None


class FakeBus:
    """Enough of pystemd's DBus: queued signals are delivered one per process() call."""

    def __init__(self, job_result: str | None = "done", state: str = "active") -> None:
        self.job_result = job_result
        self.state = state
        self.calls: list[bytes] = []
        self.callbacks: dict[bytes, Callable[..., None]] = {}
        self.queue: list[tuple[bytes, FakeMsg]] = []

    def __enter__(self) -> FakeBus:
        self.r, self.w = os.pipe()  # a real, never-readable fd for select()
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.r)
        os.close(self.w)

    def match_signal(self, sender: bytes, path: bytes, iface: bytes, member: bytes,
                     cb: Callable[..., None]) -> None:  # fmt: skip
        self.callbacks[member] = cb

    def call_method(self, dest: bytes, path: bytes, iface: bytes, method: bytes,
                    args: Any) -> FakeMsg:  # fmt: skip
        self.calls.append(method)
        if method in (b"StartTransientUnit", b"StopUnit"):
            job = b"/org/freedesktop/systemd1/job/7"
            if self.job_result is not None:
                self.queue.append(
                    (b"JobRemoved", FakeMsg([7, job, b"u", self.job_result.encode()]))
                )
            return FakeMsg(job)
        if method == b"GetUnit":
            if self.state == "gone":
                raise DBusNoSuchUnitError(-1, b"org.freedesktop.systemd1.NoSuchUnit", "no")
            return FakeMsg(b"/org/freedesktop/systemd1/unit/x")
        if method == b"KillUnit":
            raise DBusNoSuchUnitError(-1, b"org.freedesktop.systemd1.NoSuchUnit", "no")
        return FakeMsg()

    def get_property(self, dest: bytes, path: bytes, iface: bytes, prop: bytes,
                     sig: bytes) -> Any:  # fmt: skip
        return {b"ActiveState": self.state.encode(), b"SubState": b"running", b"MainPID": 42,
                b"Result": b"success"}[prop]  # fmt: skip

    def process(self) -> FakeMsg:
        if not self.queue:
            return FakeMsg()
        member, msg = self.queue.pop(0)
        self.callbacks[member](msg, error=None, userdata=None)
        return FakeMsg()

    def get_fd(self) -> int:
        return self.r


def manager(bus: FakeBus) -> SystemdUnitManager:
    return SystemdUnitManager(bus_factory=lambda: bus)  # pystemd has no stubs: DBus is Any


def test_start_subscribes_before_starting_and_returns_state() -> None:
    bus = FakeBus()
    state = manager(bus).start_transient(SPEC, timeout=5)
    assert bus.calls[:2] == [b"Subscribe", b"StartTransientUnit"]
    assert (state.active_state, state.main_pid) == ("active", 42)


def test_failed_job_names_unit_and_result() -> None:
    with pytest.raises(HostError, match=r"^starting unit ironclaw-sbx-ab12.service: job failed: "
                                        r"dependency$"):  # fmt: skip
        manager(FakeBus(job_result="dependency")).start_transient(SPEC, timeout=5)


def test_job_wait_is_bounded_and_cancels_the_start() -> None:
    bus = FakeBus(job_result=None)
    with pytest.raises(HostError, match=r"did not finish within 0\.1s"):
        manager(bus).start_transient(SPEC, timeout=0.1)
    assert bus.calls[-1] == b"StopUnit"


def test_missing_units() -> None:
    m = manager(FakeBus(state="gone"))
    assert m.state("x.service") is None
    assert m.wait_inactive("x.service", 1) is None


def test_wait_inactive_pins_the_unit() -> None:
    bus = FakeBus(state="failed")
    got = manager(bus).wait_inactive("x.service", 1)
    assert got is not None
    assert got.active_state == "failed"
    assert b"Ref" in bus.calls


def test_bad_pattern_refused() -> None:
    with pytest.raises(InvalidArgument, match="unit pattern"):
        manager(FakeBus()).list_units("ironclaw-sbx-*; rm")


def test_sandbox_units_are_hardened_as_far_as_runsc_allows() -> None:
    p = props(replace(SPEC, writable_paths=(Path("/run/ironclaw/runsc"), Path("/srv/out"))))
    assert p["PrivateNetwork"] == ("b", True)  # alongside NetworkNamespacePath, which wins
    assert p["ProtectSystem"] == ("s", "strict")
    assert p["ReadWritePaths"] == ("as", ["/run/ironclaw/runsc", "/srv/out"])
    assert p["ProtectHome"] == ("s", "yes")
    for flag in (
        "NoNewPrivileges",
        "RestrictSUIDSGID",
        "PrivateDevices",
        "PrivateTmp",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectControlGroups",
    ):
        assert p[flag] == ("b", True), flag
    # CAP_SYS_PTRACE (19), CAP_NET_ADMIN (12), CAP_SYS_MODULE (16) and CAP_SETPCAP (8) are out.
    bounding = p["CapabilityBoundingSet"][1]
    assert bounding & (1 << 21)
    assert not bounding & ((1 << 19) | (1 << 12) | (1 << 16) | (1 << 8))
    assert p["RestrictAddressFamilies"] == ("(bas)", (True, ["AF_UNIX"]))
    assert p["SystemCallFilter"][1][0] is False
    assert "@clock" in p["SystemCallFilter"][1][1]
    assert p["AmbientCapabilities"] == ("t", 0)


def test_a_grant_below_home_keeps_home_read_only_not_hidden() -> None:
    p = props(replace(SPEC, writable_paths=(Path("/home/op/shared"),)))
    assert p["ProtectHome"] == ("s", "read-only")
    assert p["ReadWritePaths"] == ("as", ["/home/op/shared"])


def test_a_read_only_grant_below_home_keeps_home_read_only_not_hidden() -> None:
    # Hidden, runsc's gofer could not open the source: every start of the session failed.
    p = props(replace(SPEC, readonly_paths=(Path("/home/op/docs"),)))
    assert p["ProtectHome"] == ("s", "read-only")
    assert p["ReadWritePaths"] == ("as", [])


# Every hardening property of a sandbox unit, written out: a setting dropped from
# hardening.sandbox_properties, or weakened, fails test_the_sandbox_hardening_is_exactly_this
# (docs/threat-model.md §4.2 lists them). Each change here is a change of the threat model.
HARDENED = replace(
    SPEC,
    writable_paths=(Path("/run/ironclaw/runsc"), Path("/srv/out")),
    readonly_paths=(Path("/srv/docs"),),
)
GOLDEN_HARDENING: list[tuple[str, str, Any]] = [
    ("NoNewPrivileges", "b", True),
    # CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID (bits 0-7),
    # SYS_CHROOT (18), SYS_ADMIN (21)
    ("CapabilityBoundingSet", "t", 0x0024_00FF),
    ("AmbientCapabilities", "t", 0),
    # CLONE_NEWNS | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
    ("RestrictNamespaces", "t", 0x7C02_0000),
    ("RestrictAddressFamilies", "(bas)", (True, ["AF_UNIX"])),
    ("SystemCallArchitectures", "as", ["native"]),
    (
        "SystemCallFilter",
        "(bas)",
        (
            False,
            ["@clock", "@cpu-emulation", "@module", "@obsolete", "@raw-io", "@reboot", "@swap"],
        ),
    ),
    ("LockPersonality", "b", True),
    ("RestrictRealtime", "b", True),
    ("RestrictSUIDSGID", "b", True),
    ("ProtectClock", "b", True),
    ("ProtectHostname", "b", True),
    ("ProtectKernelTunables", "b", True),
    ("ProtectKernelModules", "b", True),
    ("ProtectKernelLogs", "b", True),
    ("ProtectControlGroups", "b", True),
    ("ProtectSystem", "s", "strict"),
    ("ProtectHome", "s", "yes"),
    ("ReadWritePaths", "as", ["/run/ironclaw/runsc", "/srv/out"]),
    ("InaccessiblePaths", "as", ["-/run/netns"]),
    ("PrivateTmp", "b", True),
    ("PrivateDevices", "b", True),
    ("PrivateMounts", "b", True),
    ("ProtectProc", "s", "invisible"),
    ("DevicePolicy", "s", "closed"),
    ("IPAddressDeny", "a(iayu)", [(2, bytes(4), 0), (10, bytes(16), 0)]),  # AF_INET, AF_INET6 any
    ("KeyringMode", "s", "private"),
]
# Set by build_properties itself beside the hardening: never the host's network.
HARDENING_NAMES = [name for name, _, _ in GOLDEN_HARDENING] + ["PrivateNetwork"]


def test_the_sandbox_hardening_is_exactly_this() -> None:
    assert (
        hardening.sandbox_properties(["/run/ironclaw/runsc", "/srv/out"], ["/srv/docs"])
        == GOLDEN_HARDENING
    )
    built = build_properties(HARDENED)
    for prop in GOLDEN_HARDENING:
        assert prop in built, prop[0]
    assert ("PrivateNetwork", "b", True) in built


@pytest.mark.parametrize("name", HARDENING_NAMES)
def test_no_hardening_property_can_be_overridden(name: str) -> None:
    """A value each property's type would take ("auto" for DevicePolicy, "0" for a mask): only
    that the spec sets the property stops it."""
    weak = {"s": "auto", "t": "0"}.get(systemd.PROPERTY_SIGNATURES[name], "no")
    with pytest.raises(InvalidArgument, match=f"extra property {name}: set by the spec"):
        build_properties(replace(HARDENED, extra_properties={name: weak}))
