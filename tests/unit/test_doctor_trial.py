"""The doctor's runsc trial runs in a transient unit hardened like a session's (host/probes.py),
against a fake unit manager: what it starts, and how each outcome is reported."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ironclawd.domain.checks import Status
from ironclawd.errors import HostError
from ironclawd.host.hardening import SANDBOX_CAPABILITIES, capability_mask
from ironclawd.host.probes import probe_platform
from ironclawd.host.runsc import RunscInfo
from ironclawd.host.systemd import build_properties
from ironclawd.ports import UnitSpec, UnitState

RUNSC = Path("/usr/bin/runsc")


def runsc_of(date: int) -> RunscInfo:
    return RunscInfo(RUNSC, f"0.0~{date}.0", date, ("ptrace", "systrap"), frozenset())


DEBIAN_12 = runsc_of(20221219)


class Units:
    """Records what is asked; the unit ends in ``final`` (None: already collected)."""

    def __init__(self, final: UnitState | None, start_error: str = "") -> None:
        self.final, self.start_error = final, start_error
        self.specs: list[UnitSpec] = []
        self.stopped: list[str] = []
        self.reset: list[str] = []

    def start_transient(self, spec: UnitSpec, timeout: float) -> UnitState:
        self.specs.append(spec)
        if self.start_error:
            raise HostError(self.start_error)
        return UnitState(spec.name, "active", "running", 42, "")

    def wait_inactive(self, name: str, timeout: float) -> UnitState | None:
        return self.final

    def stop(self, name: str, timeout: float) -> None:
        self.stopped.append(name)

    def reset_failed(self, name: str) -> None:
        self.reset.append(name)

    def list_units(self, pattern: str) -> list[UnitState]:
        raise AssertionError("not used")


def test_a_collected_unit_passed_and_ran_hardened_without_the_hosts_network() -> None:
    units = Units(final=None)
    result = probe_platform(units, RUNSC, "ptrace", detect_runsc=lambda _: DEBIAN_12)
    assert result.status is Status.PASS, result
    [spec] = units.specs
    assert spec.name.startswith("ironclaw-doctor-ptrace-")
    assert spec.name.endswith(".service")
    assert spec.argv[0] == str(RUNSC)
    assert spec.argv[-2:] == ["do", "/bin/true"]
    assert {"--network=none", "--platform=ptrace", "--ignore-cgroups"} <= set(spec.argv)
    assert spec.netns_path is None
    assert spec.collect_mode == "inactive"
    props = {name: value for name, _, value in build_properties(spec)}
    assert props["PrivateNetwork"] is True
    assert "NetworkNamespacePath" not in props
    assert props["ProtectSystem"] == "strict"
    assert props["NoNewPrivileges"] is True
    assert units.reset == [spec.name]


def test_a_failed_unit_is_a_failed_check_naming_result_and_journal() -> None:
    units = Units(final=UnitState("x.service", "failed", "failed", 0, "exit-code"))
    result = probe_platform(units, RUNSC, "systrap", detect_runsc=lambda _: DEBIAN_12)
    assert result.status is Status.FAIL
    assert not result.required
    assert "exit-code" in result.detail
    assert "journalctl -u ironclaw-doctor-systrap-" in result.detail
    assert "systrap" in result.fix_hint
    assert units.reset == [units.specs[0].name]


def test_a_unit_that_cannot_start_is_stopped_and_reported() -> None:
    units = Units(final=None, start_error="starting unit x: job failed: failed")
    result = probe_platform(units, RUNSC, "ptrace", detect_runsc=lambda _: DEBIAN_12)
    assert result.status is Status.FAIL
    assert "job failed" in result.detail
    assert units.stopped == [units.specs[0].name]


def test_the_trial_runs_the_sessions_file_access_model() -> None:
    """A runsc with --directfs (Debian 13's) is tried with it off, as sessions run it; Debian
    12's has no such flag and gets none."""
    argvs = {}
    for flags in (frozenset(), frozenset({"directfs"})):
        found = replace(DEBIAN_12, flags=flags)

        def detect(_: Path, found: RunscInfo = found) -> RunscInfo:
            return found

        units = Units(final=None)
        result = probe_platform(units, RUNSC, "systrap", detect_runsc=detect)
        assert result.status is Status.PASS, result
        argvs[flags] = list(units.specs[0].argv)
    assert "--directfs=false" in argvs[frozenset({"directfs"})]
    assert not [a for a in argvs[frozenset()] if "directfs" in a]
    props = {name: value for name, _, value in build_properties(units.specs[0])}
    assert props["CapabilityBoundingSet"] == capability_mask(SANDBOX_CAPABILITIES)


def test_a_runsc_that_cannot_be_read_is_a_failed_trial() -> None:
    def broken(_: Path) -> RunscInfo:
        raise HostError("reading runsc version: no such file")

    units = Units(final=None)
    result = probe_platform(units, RUNSC, "systrap", detect_runsc=broken)
    assert result.status is Status.FAIL
    assert "no such file" in result.detail
    assert not units.specs
