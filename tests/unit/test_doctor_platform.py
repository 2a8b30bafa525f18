"""doctor's runsc.platform summary names the platform the daemon uses and, when runsc offers
the faster systrap but the daemon does not use it, why (the systrap trial's failure)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ironclawd.config import Config
from ironclawd.domain.checks import CheckResult, Status, failed, passed
from ironclawd.ports import RunscCheck, UnitManager
from ironclawd.services.doctor import Doctor
from tests.fakes.clock import FakeClock
from tests.fakes.host import FakeUnits


class Probes:
    def __init__(self, offered: tuple[str, ...], broken: frozenset[str] = frozenset()) -> None:
        self.offered, self.broken = offered, broken

    def runsc(self, runsc: Path) -> RunscCheck:
        return RunscCheck(passed("runsc.version", "runsc 0.0~20240729.0"), self.offered)

    def systemd(self) -> CheckResult:
        return passed("systemd.dbus", "systemd 257")

    def cgroups(self) -> CheckResult:
        return passed("cgroup.layout", "hybrid")

    def sqlcipher(self) -> CheckResult:
        return passed("sqlcipher", "ok")

    def platform(self, units: UnitManager, runsc: Path, platform: str) -> CheckResult:
        name = f"runsc.platform.{platform}"
        if platform in self.broken:
            return failed(name, "trivial sandbox failed (exit-code)", "", required=False)
        return passed(name, "a trivial sandbox ran in a hardened unit", required=False)


def summary(probes: Probes, in_use: str | None) -> CheckResult:
    doctor = Doctor(
        config_path=Path("/nonexistent/ironclawd.toml"), config=Config(), netns=None,
        units=FakeUnits(), probes=probes, clock=FakeClock(),
        platform_in_use=None if in_use is None else (lambda: in_use),
    )  # fmt: skip
    results = asyncio.run(doctor.run())
    [platform] = [r for r in results if r.name == "runsc.platform"]
    return platform


def test_the_platform_in_use_is_named() -> None:
    result = summary(Probes(("ptrace", "kvm", "systrap")), "systrap")
    assert result.status is Status.PASS
    assert result.detail.startswith("will use 'systrap' (in use; working: ")


def test_systrap_offered_but_broken_says_why_ptrace() -> None:
    result = summary(Probes(("ptrace", "kvm", "systrap"), frozenset({"systrap"})), "ptrace")
    assert result.status is Status.PASS
    assert "will use 'ptrace'" in result.detail
    assert "systrap not used: trivial sandbox failed (exit-code)" in result.detail


def test_a_platform_in_use_that_fails_its_trial_fails() -> None:
    result = summary(Probes(("ptrace",), frozenset({"ptrace"})), "ptrace")
    assert result.status is Status.FAIL
    assert "the daemon uses 'ptrace'" in result.detail


def test_without_the_daemons_choice_doctor_reports_its_own() -> None:
    result = summary(Probes(("ptrace", "systrap")), None)
    assert result.detail.startswith("will use 'systrap' (working: ")
