"""``ironctl --version`` as an operator runs it: one line, and neither grpc nor any command module
imported on the way (``python -X importtime`` lists every import)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ironclawd import __version__

ROOT = Path(__file__).resolve().parents[2]


def test_ironctl_version_imports_no_grpc() -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ironclawd.ctl.cli", "--version"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert done.stdout == f"ironctl {__version__}\n"
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()]
    assert "ironclawd" in imported
    heavy = [m for m in imported if m.startswith(("grpc", "google.protobuf", "ironclawd.ctl.main"))]
    assert heavy == []


def test_ironclawd_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ironclawd.daemon", "--version"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert done.stdout == f"ironclawd {__version__}\n"
