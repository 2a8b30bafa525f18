"""doctor's outbound.namespace check reports what the daemon's mount namespace says of itself
(``MountSpace.health``): a pass with what was seen, or a failure that names the problem and
what to do. A doctor built without a namespace (no daemon's) has no such check."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ironclawd.config import Config
from ironclawd.domain.checks import CheckResult, Status
from ironclawd.services.doctor import Doctor
from tests.fakes.clock import FakeClock
from tests.fakes.host import FakeUnits
from tests.unit.test_doctor_platform import Probes


class Space:
    """The health part of ``ports.MountSpace``."""

    def __init__(self, ok: bool, detail: str) -> None:
        self.answer = (ok, detail)

    def health(self) -> tuple[bool, str]:
        return self.answer


def checks(space: Space | None) -> dict[str, CheckResult]:
    doctor = Doctor(
        config_path=Path("/nonexistent/ironclawd.toml"), config=Config(), netns=None,
        units=FakeUnits(), probes=Probes(("ptrace",)), clock=FakeClock(),
        space=space,  # type: ignore[arg-type]
    )  # fmt: skip
    return {r.name: r for r in asyncio.run(doctor.run())}


def test_a_pinned_namespace_passes_with_what_was_seen() -> None:
    result = checks(Space(True, "pinned at /run/ironclaw/mntns/ns (joined at start)"))
    check = result["outbound.namespace"]
    assert check.status is Status.PASS
    assert check.detail == "pinned at /run/ironclaw/mntns/ns (joined at start)"


def test_a_lost_pin_fails_and_says_what_to_do() -> None:
    check = checks(Space(False, "nothing is pinned at /run/ironclaw/mntns/ns"))[
        "outbound.namespace"
    ]
    assert check.status is Status.FAIL
    assert check.required
    assert check.detail == "nothing is pinned at /run/ironclaw/mntns/ns"
    assert "stop the running sessions" in check.fix_hint
    assert "restart ironclawd" in check.fix_hint


def test_without_a_namespace_there_is_no_such_check() -> None:
    assert "outbound.namespace" not in checks(None)
