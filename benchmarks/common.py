"""What every benchmark shares: interleaved A/B rounds, figures beside their baselines, the
machine's facts and the result files (``results/bench-<name>.json``, read by benchmarks/table.py).

A figure is one line of the table: what was measured, its median and p90, and the baseline doing
the same work measured in the same run (``ratio`` = figure median / baseline median), or
``None`` with a ``note`` saying why there is none (e.g. "not measured: ...").
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from benchmarks.stats import summary_ms

ROOT = Path(__file__).resolve().parents[1]
# Where results go: results/ (committed), or BENCH_RESULTS (``make bench-smoke``: a scratch
# directory inside the checkout, which scripts/with-systemd keeps writable).
RESULTS = Path(os.environ.get("BENCH_RESULTS") or ROOT / "results")
DAEMON_CONFIG = Path("/etc/ironclaw/ironclawd.toml")
DATE_FORMAT = "%Y-%m-%d %H:%M UTC"  # a result file's machine["date"]

# round number -> seconds taken by the timed part, or several named timings of one round
Way = Callable[[int], "float | Mapping[str, float]"]


def env_int(name: str, default: int) -> int:
    """An integer knob from the environment (``BENCH_ROUNDS=20 make bench``)."""
    return int(os.environ.get(name, str(default)))


ROUNDS = env_int("BENCH_ROUNDS", 10)

# A session's meters out of the way, for a benchmark whose client calls back to back: the
# figures are the path's, not the policy's. A closed loop of calls is paced by the call rate
# (50 a second) and, when each call takes the loop longer than a tenth of its time between calls
# (a streamed model answer), by the loop share (the agent waits such refusals out; a benchmark's
# plain client fails on them). The policies are the tests' to attack.
SOCKET_METERS_LIFTED = "\n[sockets]\ncalls_per_second = 100000\nloop_share = 1.0\n"


def interleave(ways: Mapping[str, Way], rounds: int, warmup: int = 1) -> dict[str, list[float]]:
    """Run every way once per round, the order rotating each round (A B C, B C A, ...), so that
    drift on a shared machine hits every way alike; the first ``warmup`` rounds are dropped.
    Samples are keyed by way, or by the names a way returns."""
    names = list(ways)
    samples: dict[str, list[float]] = {}
    for r in range(warmup + rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            took = ways[name](r)
            if r < warmup:
                continue
            for key, value in took.items() if isinstance(took, Mapping) else [(name, took)]:
                samples.setdefault(key, []).append(value)
    return samples


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn()`` took."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def rate_summary(values: list[float], digits: int = 1) -> dict[str, float]:
    """Median and p10 (the slow end, nearest rank) of rates (higher is better), and the count.
    The median of an even count is the mean of the two middle rates, as ``summary_ms``'s: the
    upper of the two flattered every rate of 10 rounds."""
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), digits),
        "p10": round(ordered[max(0, math.ceil(len(ordered) * 0.1) - 1)], digits),
        "n": len(ordered),
    }


def figure(
    name: str,
    value: Mapping[str, float] | None,
    baseline_name: str = "",
    baseline: Mapping[str, float] | None = None,
    *,
    unit: str = "ms",
    note: str = "",
) -> dict[str, Any]:
    """One table line. ``value``/``baseline`` are summaries (``summary_ms`` for ``ms``,
    ``rate_summary`` for rates, ``{"median": x}`` for a single figure)."""
    key = "median_ms" if unit == "ms" else "median"
    ratio = None
    if value and baseline and baseline.get(key):
        ratio = round(value[key] / baseline[key], 2)
    return {
        "figure": name,
        "unit": unit,
        "value": dict(value) if value else None,
        "baseline_name": baseline_name,
        "baseline": dict(baseline) if baseline else None,
        "ratio": ratio,
        "note": note,
    }


def ms_figure(name: str, samples: list[float], baseline_name: str, base: list[float]) -> Any:
    """A latency figure from samples in seconds, beside its baseline's samples."""
    return figure(name, summary_ms(samples), baseline_name, summary_ms(base) if base else None)


def not_measured(name: str, why: str, unit: str = "ms") -> dict[str, Any]:
    return figure(name, None, unit=unit, note=f"not measured: {why}")


def host_mounts() -> int:
    """Mounts in PID 1's mount namespace: what systemd copies into each new unit's own."""
    return len(Path("/proc/1/mountinfo").read_text().splitlines())


def _run(*argv: str) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({exc})"
    return (proc.stdout + proc.stderr).strip()


def daemon_platform() -> str:
    """The platform the running daemon chose (its start-up journal line)."""
    text = _run("journalctl", "-u", "ironclawd", "-b", "--no-pager", "-o", "cat", "-g", "platform")
    found = re.findall(r"runsc (\S+): platform (\w+)", text)
    return f"{found[-1][1]} (runsc {found[-1][0]})" if found else "unknown"


def filesystem_of(path: str, mountinfo: str | None = None) -> str:
    """The filesystem type and source holding ``path`` (the mount with the longest matching
    mount point in /proc/self/mountinfo), e.g. ``ext4 (/dev/vda)``: an fsync on a tmpfs costs
    nothing, on a disk it does, so a figure of the message path depends on it."""
    if mountinfo is None:
        with open("/proc/self/mountinfo") as f:
            mountinfo = f.read()
    best, found = -1, "unknown"
    for line in mountinfo.splitlines():
        fields, _, rest = line.partition(" - ")
        point = fields.split()[4].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            fstype, source = [*rest.split(), "", ""][:2]
            best, found = len(point), f"{fstype} ({source})"
    return found


# At the benchmark's start (each runs in a process of its own): taken when its file is
# written, a density run's load average was the removal of its 500 sessions.
_LOAD_AT_START = os.getloadavg()


def machine() -> dict[str, Any]:
    """The facts a figure is worthless without."""
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    runsc = _run("runsc", "--version").splitlines()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        # The venv's interpreter, the daemon's and this process's (scripts/install-dev).
        "python": f"{platform.python_version()} ({os.path.realpath(sys.executable)})",
        "runsc": runsc[0].removeprefix("runsc version ") if runsc else "unknown",
        "platform": daemon_platform(),
        "state_filesystem": filesystem_of("/var/lib/ironclaw"),
        "load_average_at_start": _LOAD_AT_START,
        "load_average_at_end": os.getloadavg(),
        "date": datetime.datetime.now(datetime.UTC).strftime(DATE_FORMAT),
    }


def write_result(name: str, figures: list[dict[str, Any]], **extra: Any) -> Path:
    """``results/bench-<name>.json``: the figures, the machine, anything else worth keeping."""
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"bench-{name}.json"
    doc = {"benchmark": name, "machine": machine(), "figures": figures, **extra}
    out.write_text(json.dumps(doc, indent=2) + "\n")
    for f in figures:
        print(one_line(f))
    print(f"written: {out}")
    return out


def write_doc(name: str, doc: Mapping[str, Any]) -> Path:
    """``results/bench-<name>.json`` for a benchmark that writes its own shape (mcp, packages,
    channels), with ``machine()`` under its own machine facts: the date above all, by which
    benchmarks/table.py tells a file of the run from one left from an earlier run."""
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"bench-{name}.json"
    full = {**doc, "machine": {**machine(), **doc.get("machine", {})}}
    out.write_text(json.dumps(full, indent=2) + "\n")
    return out


def one_line(f: Mapping[str, Any]) -> str:
    """A figure as a line of text (what a benchmark prints as it finishes)."""
    key = "median_ms" if f["unit"] == "ms" else "median"
    if f["value"] is None:
        return f"{f['figure']}: {f['note']}"
    shown = f"{f['figure']}: {f['value'][key]} {f['unit']}"
    if f["baseline"]:
        shown += f" vs {f['baseline_name']} {f['baseline'][key]} {f['unit']}"
        if f["ratio"] is not None:  # none beside a baseline of 0
            shown += f" ({f['ratio']}x)"
    return shown


@contextlib.contextmanager
def daemon_config(extra: str) -> Iterator[None]:
    """The daemon restarted with ``extra`` added to its config file for the ``with`` block, then
    restarted with the file as it was (or without one)."""
    previous = DAEMON_CONFIG.read_text() if DAEMON_CONFIG.exists() else None
    DAEMON_CONFIG.write_text((previous or "") + extra)
    subprocess.run(["systemctl", "restart", "ironclawd.service"], check=True)
    try:
        yield
    finally:
        if previous is None:
            DAEMON_CONFIG.unlink()
        else:
            DAEMON_CONFIG.write_text(previous)
        subprocess.run(["systemctl", "restart", "ironclawd.service"], check=False)
