"""``make bench``: every benchmark (or those named: ``make bench BENCH="packages mcp"``), under a
private systemd with ironclawd installed, then the table (benchmarks/table.py ->
results/BENCH.md). A benchmark that fails is named in the table; the others still run.
``results/bench-run.json`` records how long the run took."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import table

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = (
    "sessions",
    "messages",
    "pool",
    "density",
    "platforms",
    "egress",
    "model_proxy",
    "mcp",
    "packages",
    "channels",
)
# Run only when named (make bench BENCH=unit_mounts): a measurement behind docs/development.md's
# account of host mounts, not one of the figures.
OPTIONAL = ("unit_mounts",)


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in BENCHMARKS + OPTIONAL]
    if unknown:
        known = ", ".join(BENCHMARKS + OPTIONAL)
        print(
            f"bench: no benchmark {', '.join(unknown)} (one of: {known})",
            file=sys.stderr,
        )
        return 2
    chosen = names or list(BENCHMARKS)
    started = time.monotonic()
    # Each benchmark in turn; a failure is recorded in a file and the next one runs.
    failed_file = ROOT / "results" / ".bench-failed"
    (ROOT / "results").mkdir(exist_ok=True)
    failed_file.unlink(missing_ok=True)
    runs = "; ".join(
        f"{{ echo '== {n}'; .venv/bin/python -m benchmarks.{n} || echo {n} >>{failed_file}; }}"
        for n in chosen
    )
    inner = f"scripts/install-dev >/dev/null && {{ {runs}; }}"
    code = subprocess.call([str(ROOT / "scripts/with-systemd"), "bash", "-c", inner], cwd=ROOT)
    failed = failed_file.read_text().split() if failed_file.exists() else []
    failed_file.unlink(missing_ok=True)
    record = {
        "seconds": round(time.monotonic() - started, 1),
        "benchmarks": chosen,
        "failed": failed,
        "rounds": os.environ.get("BENCH_ROUNDS", "default"),
        "note": os.environ.get("BENCH_NOTE", ""),
    }
    (ROOT / "results" / "bench-run.json").write_text(json.dumps(record, indent=2) + "\n")
    table.main()
    return code or (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
