"""A real run of pytest on a host without runsc: under CI (or IRONCLAW_REQUIRE_REAL=1) the
integration tier fails instead of skipping, so a CI run cannot pass on the unit tier alone
(tests/harness/fixtures.py). Outside CI the same test skips, saying why: the control. The missing
runsc is a PATH of links to every tool here but runsc; nothing is booted (the check comes first).
tests/unit/test_real_tiers_never_skip.py covers a missing root and the other tiers in-process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.fixtures import ROOT

pytestmark = pytest.mark.integration

# One test that boots a private systemd (the first thing it asks for).
VICTIM = (
    "tests/integration/test_private_systemd.py"
    "::test_transient_units_run_and_their_limits_are_enforced"
)


@pytest.fixture(scope="module")
def path_without_runsc(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A directory of links to every executable on PATH except runsc."""
    farm = tmp_path_factory.mktemp("bin-without-runsc")
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            link = farm / entry.name
            if entry.name != "runsc" and not link.exists() and not link.is_symlink():
                link.symlink_to(entry.path)
    return str(farm)


def run_pytest(path: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "IRONCLAW_REQUIRE_REAL")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", VICTIM],
        cwd=ROOT,
        env={**base, "PATH": path, "PYTHONDONTWRITEBYTECODE": "1", **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("env", [{"CI": "true"}, {"IRONCLAW_REQUIRE_REAL": "1"}])
def test_without_runsc_the_tier_fails_under_ci(
    path_without_runsc: str, env: dict[str, str]
) -> None:
    proc = run_pytest(path_without_runsc, **env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "1 error" in output, output
    assert "may not skip under CI" in output, output
    assert "needs runsc" in output, output


def test_outside_ci_it_skips_saying_why(path_without_runsc: str) -> None:
    proc = run_pytest(path_without_runsc)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "1 skipped" in output, output
    assert "needs runsc" in output, output


def test_the_runsc_free_path_still_has_what_booting_needs(path_without_runsc: str) -> None:
    """The control for the PATH: only runsc is missing (so the failure is about runsc)."""
    names = set(os.listdir(path_without_runsc))
    assert "runsc" not in names
    assert {"unshare", "nsenter", "setpriv", "mount", "systemctl"} <= names
    assert Path(path_without_runsc, "systemctl").resolve().exists()
