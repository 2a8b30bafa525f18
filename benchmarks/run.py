"""``make bench``: every benchmark, under a private systemd with ironclawd installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    inner = (
        "scripts/install-dev >/dev/null && .venv/bin/python -m benchmarks.sessions"
        " && .venv/bin/python -m benchmarks.egress"
        " && .venv/bin/python -m benchmarks.model_proxy"
        " && .venv/bin/python -m benchmarks.messages"
        " && .venv/bin/python -m benchmarks.mcp"
    )
    return subprocess.call([str(ROOT / "scripts/with-systemd"), "bash", "-c", inner], cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main())
