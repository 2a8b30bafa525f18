"""``make bench``: every benchmark (or those named: ``make bench BENCH="packages mcp"``), under a
private systemd with ironclawd installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ("sessions", "egress", "model_proxy", "messages", "mcp", "packages", "channels")


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(
            f"bench: no benchmark {', '.join(unknown)} (one of: {', '.join(BENCHMARKS)})",
            file=sys.stderr,
        )
        return 2
    runs = " && ".join(f".venv/bin/python -m benchmarks.{n}" for n in names or BENCHMARKS)
    inner = f"scripts/install-dev >/dev/null && {runs}"
    return subprocess.call([str(ROOT / "scripts/with-systemd"), "bash", "-c", inner], cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
