"""``make bench``: every benchmark (or those named: ``make bench BENCH="packages mcp"``), under a
private systemd with ironclawd installed, then the table (benchmarks/table.py ->
results/BENCH.md). A benchmark that fails is named in the table; the others still run.
``results/bench-run.json`` records how long the run took."""

from __future__ import annotations

import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import table
from benchmarks.common import DATE_FORMAT, RESULTS

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
# The daemon's state and the baselines' files, on the checkout's own filesystem (a disk): inside
# scripts/with-systemd everything else is a tmpfs, where an fsync costs nothing. On this
# machine's ext4 a warm round trip took ~2-3 ms more than on the tmpfs (docs/development.md).
DISK_STATE = ROOT / "build" / "bench-state"


def state_on_disk(where: Path) -> str:
    """Shell run first inside the private systemd: ``/var/lib/ironclaw`` (state database, audit
    log, inbound queues, bundles) becomes ``where/lib``, and TMPDIR (the bare baselines' queues
    and bundles, made with ``tempfile``) ``where/tmp``, so that both sides of a comparison write
    to the same disk a deployment would."""
    lib, tmp = shlex.quote(str(where / "lib")), shlex.quote(str(where / "tmp"))
    return (
        f"mkdir -p {lib} {tmp} /var/lib/ironclaw && mount --bind {lib} /var/lib/ironclaw "
        f"&& chmod 0700 /var/lib/ironclaw && export TMPDIR={tmp}"
    )


def clear(where: Path) -> None:
    """Remove a run's disk state. The audit log there is append-only (chattr +a, which the
    daemon sets where the filesystem has it): the flag goes first, or even root cannot
    remove it."""
    if where.exists():
        subprocess.run(["chattr", "-R", "-a", str(where)], capture_output=True, check=False)
        shutil.rmtree(where)


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
    # In the result files' form (machine["date"]): benchmarks/table.py names a file written
    # before this (one left from an earlier run) apart from this run.
    began = datetime.datetime.now(datetime.UTC).strftime(DATE_FORMAT)
    # Each benchmark in turn; a failure is recorded in a file and the next one runs.
    failed_file = RESULTS / ".bench-failed"
    RESULTS.mkdir(parents=True, exist_ok=True)
    failed_file.unlink(missing_ok=True)
    runs = "; ".join(
        f"{{ echo '== {n}'; .venv/bin/python -m benchmarks.{n} || echo {n} >>{failed_file}; }}"
        for n in chosen
    )
    inner = f"{state_on_disk(DISK_STATE)} && scripts/install-dev >/dev/null && {{ {runs}; }}"
    clear(DISK_STATE)
    try:
        code = subprocess.call([str(ROOT / "scripts/with-systemd"), "bash", "-c", inner], cwd=ROOT)
    finally:
        clear(DISK_STATE)
    failed = failed_file.read_text().split() if failed_file.exists() else []
    failed_file.unlink(missing_ok=True)
    record = {
        "started": began,
        "seconds": round(time.monotonic() - started, 1),
        "benchmarks": chosen,
        "failed": failed,
        "rounds": os.environ.get("BENCH_ROUNDS", "default"),
        "note": os.environ.get("BENCH_NOTE", ""),
    }
    (RESULTS / "bench-run.json").write_text(json.dumps(record, indent=2) + "\n")
    table.main()
    return code or (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
