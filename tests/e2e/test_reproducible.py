"""The Debian package is reproducible: a second build from another clean export, with an empty
pip cache, is byte-identical to the first.

The first build is the e2e tier's (packaging/build-deb, cached in dist/<suite>/ when its inputs
are unchanged); the second is forced (`--fresh`: never the cached .deb, a new empty pip cache,
a new export of the tracked files, a new overlay on the suite's build chroot) into
build/repro/<suite>/. On a difference the failure shows diffoscope's report (scripts/install-deps
installs diffoscope-minimal), else cmp's first differing bytes.

IRONCLAW_REPRO_SUITES (default: bookworm) names the suites checked, comma-separated; a forced
build takes ~3 minutes on 2 cores. It skips, saying why, without root or debootstrap (under CI
it fails).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.harness.fixtures import OPTED_OUT, ROOT

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.environ.get("IRONCLAW_E2E") == "0",
        reason=f"{OPTED_OUT}IRONCLAW_E2E=0: the .deb builds are not wanted in this run",
    ),
]

BUILD_DEB = ROOT / "packaging" / "build-deb"
SUITES = [s for s in os.environ.get("IRONCLAW_REPRO_SUITES", "bookworm").split(",") if s]
BUILD_TIMEOUT = 1800.0
DIFFOSCOPE_TIMEOUT = 900.0


def _missing_prerequisite() -> str | None:
    if os.geteuid() != 0:
        return "needs root (packaging/build-deb builds in a chroot)"
    for tool in ("debootstrap", "unshare", "git", "dpkg-parsechangelog"):
        if shutil.which(tool) is None:
            return f"needs {tool} (scripts/install-deps)"
    return None


def _build(suite: str, *extra: str) -> Path:
    """Run packaging/build-deb; the .deb's path is its last stdout line."""
    started = time.monotonic()
    proc = subprocess.run(
        [str(BUILD_DEB), "--suite", suite, *extra],
        cwd=ROOT,
        capture_output=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )
    assert proc.returncode == 0, (
        f"build-deb --suite {suite} {' '.join(extra)}: exit {proc.returncode}\n"
        + proc.stderr.decode(errors="replace")[-4000:]
    )
    print(f"build-deb --suite {suite} {' '.join(extra)}: {time.monotonic() - started:.0f} s")
    return Path(proc.stdout.decode().strip().splitlines()[-1]).resolve(strict=True)


def _explain(first: Path, second: Path) -> str:
    """diffoscope's report of the two packages (or cmp's, without diffoscope)."""
    if shutil.which("diffoscope") is not None:
        proc = subprocess.run(
            ["diffoscope", "--text", "-", "--max-report-size", "200000", str(first), str(second)],
            capture_output=True,
            timeout=DIFFOSCOPE_TIMEOUT,
            check=False,
        )
        return (
            proc.stdout.decode(errors="replace")[-20000:]
            + proc.stderr.decode(errors="replace")[-2000:]
        )
    proc = subprocess.run(
        ["cmp", "-l", str(first), str(second)], capture_output=True, timeout=60, check=False
    )
    head = b"\n".join(proc.stdout.splitlines()[:20]).decode(errors="replace")
    return f"(no diffoscope: scripts/install-deps installs diffoscope-minimal)\ncmp -l:\n{head}"


@pytest.mark.parametrize("suite", SUITES)
def test_two_builds_are_byte_identical(suite: str) -> None:
    reason = _missing_prerequisite()
    if reason is not None:
        pytest.skip(f"reproducible build test: {reason}")
    first = _build(suite)
    second = _build(suite, "--fresh", "--outdir", f"build/repro/{suite}")
    assert first.name == second.name
    if first.read_bytes() != second.read_bytes():
        pytest.fail(
            f"{first} and {second} differ:\n{_explain(first, second)}",
            pytrace=False,
        )
