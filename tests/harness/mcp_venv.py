"""The test MCP servers' virtualenv (scripts/mcp-test-venv: pinned mcp-server-time,
mcp-server-git and the SDK, on Debian's python3.11, cached under build/ by the pins)."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ROOT / "tests" / "harness" / "mcp_hostile.py"


@cache
def mcp_venv() -> Path:
    """The venv's directory, built on first use (about 30 s with the registry, then cached)."""
    proc = subprocess.run(
        [str(ROOT / "scripts" / "mcp-test-venv")], capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/mcp-test-venv failed: {proc.stderr[-2000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])
