"""``results/BENCH.md``: every figure of every ``results/bench-*.json`` beside its baseline, with
the machine it ran on. Run at the end of ``make bench`` (or alone: ``python -m
benchmarks.table``); it only reads the result files.
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from benchmarks.common import DATE_FORMAT, RESULTS, figure

# Dates are to the minute and a file is written when its benchmark ends: room for both.
RUN_SLACK = 120.0
ORDER = ("sessions", "messages", "pool", "density", "platforms", "egress", "model-proxy", "mcp",
         "packages", "channels")  # fmt: skip


# Issue 17's targets on this 2-core machine (medians), by the start of a figure's name.
TARGETS = {
    "pooled engage: ironctl": "<= 100 ms",
    "session create (ironctl": "<= 1.1x bare",
    "round trip, one warm session": "<= 8 ms p50, <= 15 ms p99",
    "aggregate msg/s, 20 sessions": ">= 300 msg/s",
    "idle memory per session": "<= 35 MiB",
    "idle CPU of 500 sandboxes": "<= 25% of a core",
    "ironctl status": "<= 40 ms",
    "restart to READY, 0 sessions": "<= 150 ms",
    "restart to READY, 100 sessions": "<= 250 ms",
    "egress 4 MiB, broker over gRPC": ">= 0.8x direct",
    "model completion through the proxy": "<= 1 ms added",
}


def target(name: str) -> str:
    return next((t for start, t in TARGETS.items() if name.startswith(start)), "")


def _legacy(name: str, doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Figures of the benchmarks that write their own shape (mcp, packages, channels)."""
    pairs: list[tuple[str, str, str, str]] = []  # (group, way, group, baseline way)
    if name == "mcp":
        pairs = [
            ("warm", w, "warm", "direct_sdk")
            for w in ("supervisor", "supervisor_list_and_call", "mcp_sock")
        ]
        pairs += [("warm", "sandbox_mcp_tool", "warm", "sandbox_local_tool"),
                  ("cold", "sandbox", "cold", "direct_sdk")]  # fmt: skip
    elif name == "packages":
        pairs = [
            (
                "session_start",
                "session_start_jq_image",
                "session_start",
                "session_start_base_image",
            ),
            ("tools", "tool_run_jq", "tools", "tool_list_files"),
        ]
    elif name == "channels":
        pairs = [("figures", w, "figures", "admin_api") for w in
                 ("webhook", "matrix", "ironctl_send")]  # fmt: skip
    out = []
    for group, way, base_group, base in pairs:
        value = doc.get(group, {}).get(way)
        baseline = doc.get(base_group, {}).get(base)
        if value is not None:
            out.append(figure(f"{way.replace('_', ' ')}", value, base.replace("_", " "), baseline))
    return out


def load(results: Path = RESULTS) -> Iterator[tuple[str, dict[str, Any]]]:
    docs = {}
    for path in results.glob("bench-*.json"):
        name = path.stem.removeprefix("bench-")
        if name == "run":
            continue
        docs[name] = json.loads(path.read_text())
    for name in sorted(docs, key=lambda n: (ORDER.index(n) if n in ORDER else 99, n)):
        yield name, docs[name]


def _cell(summary: Mapping[str, Any] | None, unit: str, key: str) -> str:
    if not summary:
        return ""
    if unit == "ms":
        value = summary.get(f"{key}_ms")
    else:
        value = summary.get("p10" if key == "p90" else key)
    return "" if value is None else f"{value:g}"


def _load(machine: Mapping[str, Any]) -> str:
    shown = ", ".join(f"{x:.1f}" for x in machine.get("load_average_at_start", []))
    if "load_average_at_end" in machine:
        return f"load average at the start {shown}"
    # Files written before load_average_at_end existed took the "start" figure at their end.
    return f"load average when its first file was written {shown}"


def _when(machine: Mapping[str, Any], key: str = "date") -> datetime.datetime:
    """A file's date (or the run's start), as benchmarks/common.py writes it."""
    return datetime.datetime.strptime(str(machine[key]), DATE_FORMAT)


def render(results: Path = RESULTS) -> str:
    docs = list(load(results))
    run = results / "bench-run.json"
    run_doc = json.loads(run.read_text()) if run.exists() else {}
    # The recorded run's machine, from its first benchmark (whose load at the start is the
    # run's); files of benchmarks run apart from it are listed with their own date and load.
    in_run = {n.replace("_", "-") for n in run_doc.get("benchmarks", [])}
    broke = {n.replace("_", "-") for n in run_doc.get("failed", [])}
    dated = [(n, d["machine"]) for n, d in docs if "date" in d.get("machine", {})]
    # A benchmark that failed in the run wrote no file of that run: what is there is older.
    listed = [(n, m) for n, m in dated if n in in_run and n not in broke]
    # A file the run lists but written before the run began (left from an earlier one) or after
    # it had ended (a later run of that benchmark alone) is named apart, like one the run never
    # had. Without the run's recorded start, its first file stands for it.
    if listed:
        first = (
            _when(run_doc, "started") if "started" in run_doc else min(_when(m) for _, m in listed)
        )
        ended = first + datetime.timedelta(seconds=float(run_doc.get("seconds", 0)) + RUN_SLACK)
        listed = [(n, m) for n, m in listed if first <= _when(m) <= ended]
    ours = [m for _, m in listed] if in_run else [m for _, m in dated]
    machine: dict[str, Any] = min(ours, key=lambda m: str(m["date"])) if ours else {}
    kept = {n for n, _ in listed}
    apart = [(n, m) for n, m in dated if in_run and n not in kept]
    # Files that say nothing of when they were written cannot be placed in or out of the run.
    undated = [n for n, d in docs if in_run and "date" not in d.get("machine", {})]
    lines = [
        "# IronClaw benchmarks",
        "",
        "Generated by `benchmarks/table.py` from `results/bench-*.json` (`make bench`). Every "
        "figure is beside a baseline doing the same work, measured in the same run, the two "
        "interleaved round by round (A, B, A, B, ...); ratio = median / baseline median. "
        "Latencies in ms (median, p90); rates (msg/s) show median and the slowest tenth (p10).",
        "",
        f"- machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, "
        f"{machine.get('memory_gib', '?')} GiB",
        f"- kernel {machine.get('kernel', '?')}; Python {machine.get('python', '(not recorded)')}; "
        f"runsc {machine.get('runsc', '?')}; daemon's "
        f"platform {machine.get('platform', '?')}; its state (and the baselines' files) on "
        f"{machine.get('state_filesystem', 'a tmpfs (not recorded in this run)')}",
        f"- date {machine.get('date', '?')}; {_load(machine)}",
    ]
    if run_doc:
        failed = ", ".join(run_doc.get("failed", [])) or "none"
        lines.append(
            f"- `make bench` (after its prerequisites) took {run_doc['seconds'] / 60:.1f} min for "
            f"{' '.join(run_doc['benchmarks'])}; failed: {failed}"
        )
    if run_doc.get("note"):
        lines.append(f"- {run_doc['note']}")
    for name, other in apart:
        # What differs from the run's machine is named: a figure from another CPU or
        # interpreter is not comparable with the run's.
        differs = [
            f"{label} {other.get(key, '(not recorded)')}"
            for key, label in (("cpu", "CPU"), ("python", "Python"))
            if other.get(key) != machine.get(key)
        ]
        lines.append(
            f"- {name} was run apart from that run: {other.get('date', '?')}, kernel "
            f"{other.get('kernel', '?')}, {', '.join([*differs, _load(other)])}"
        )
    lines += [f"- {n} has no date: its figures are not known to be from that run" for n in undated]
    lines += [
        "",
        "| benchmark | figure | median | p90 | unit | baseline | baseline median | baseline p90 "
        "| ratio | target |",
        "|---|---|---:|---:|---|---|---:|---:|---:|---|",
    ]
    for name, doc in docs:
        figures = doc["figures"] if isinstance(doc.get("figures"), list) else _legacy(name, doc)
        for f in figures:
            unit = f["unit"]
            if f["value"] is None:
                lines.append(
                    f"| {name} | {f['figure']} | | | {unit} | {f['note']} | | | | "
                    f"{target(f['figure'])} |"
                )
                continue
            ratio = "" if f["ratio"] is None else f"{f['ratio']:g}x"
            base = f["baseline_name"] or f["note"]
            lines.append(
                f"| {name} | {f['figure']} | {_cell(f['value'], unit, 'median')} | "
                f"{_cell(f['value'], unit, 'p90')} | {unit} | {base} | "
                f"{_cell(f['baseline'], unit, 'median')} | {_cell(f['baseline'], unit, 'p90')} | "
                f"{ratio} | {target(f['figure'])} |"
            )
    notes = [(name, doc["notes"]) for name, doc in docs if doc.get("notes")]
    if notes:
        lines += ["", "## Notes", ""]
        lines += [f"- **{name}**: {text}" for name, text in notes]
    return "\n".join(lines) + "\n"


def main() -> int:
    text = render()
    out = RESULTS / "BENCH.md"
    out.write_text(text)
    print(text)
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
