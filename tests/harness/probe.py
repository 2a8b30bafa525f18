"""The red-team probe in the box, and the frozen images the tests build.

The probe (``redteam_probe/``) is a test-only program, frozen like the agent by
``packaging/build-agent --program probe`` (same PyInstaller flags: no interpreter executable, no
shell) and cached in ``build/probe/<hash>/``. ``scripts/install-dev --with-probe`` (what the
``daemon`` fixture runs) copies it into the agent image as ``probe/``, so inside a session's
sandbox it is ``PROBE_IN_BOX``; the shipped agent image and the .deb never contain it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_AGENT = REPO / "packaging" / "build-agent"
AGENT_IN_BOX = "/app/agent/agent"
PROBE_IN_BOX = "/app/agent/probe/probe"
PROBE_SUBDIR = "probe"  # where the probe's --onedir tree sits inside a test agent image


def build(program: str) -> Path:
    """Freeze ``program`` ("agent" or "probe") with packaging/build-agent (cached by input hash)
    and return its build/<program>/<hash>/ directory."""
    proc = subprocess.run(
        [sys.executable, str(BUILD_AGENT), "--program", program, "--python", sys.executable],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, f"build-agent --program {program}: {proc.stderr}"
    return Path(proc.stdout.strip().splitlines()[-1])
