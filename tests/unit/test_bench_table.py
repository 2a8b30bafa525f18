"""The header of results/BENCH.md (benchmarks/table.py): it names the recorded run's machine
and load, and each benchmark file run apart from that run with its own date and load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.common import figure, one_line
from benchmarks.table import render


def _write(results: Path, name: str, date: str, load: list[float], at_end: bool) -> None:
    machine: dict[str, Any] = {"cpu": "CPU", "cores": 2, "memory_gib": 1.0, "kernel": "k",
                               "runsc": "r", "platform": "ptrace", "date": date,
                               "load_average_at_start": load}  # fmt: skip
    if at_end:
        machine["load_average_at_end"] = [9.0, 9.0, 9.0]
    doc = {"benchmark": name, "machine": machine, "figures": []}
    (results / f"bench-{name}.json").write_text(json.dumps(doc))


def _render_run(results: Path, benchmarks: list[str]) -> str:
    """The table, with a recorded 700 s run of ``benchmarks``."""
    run = {"seconds": 700, "benchmarks": benchmarks, "failed": [], "note": ""}
    (results / "bench-run.json").write_text(json.dumps(run))
    return render(results)


def test_the_header_is_the_runs_first_benchmark_and_a_separate_run_is_named(
    tmp_path: Path,
) -> None:
    _write(tmp_path, "sessions", "2026-12-02 15:49 UTC", [0.8, 1.2, 1.4], at_end=True)
    _write(tmp_path, "density", "2026-12-02 15:59 UTC", [7.8, 15.6, 10.9], at_end=True)
    _write(tmp_path, "density-500", "2026-12-03 16:59 UTC", [5.7, 6.1, 5.3], at_end=True)
    text = _render_run(tmp_path, ["sessions", "density"])
    assert "- date 2026-12-02 15:49 UTC; load average at the start 0.8, 1.2, 1.4" in text
    assert "- density-500 was run apart from that run: 2026-12-03 16:59 UTC" in text
    assert "load average at the start 5.7, 6.1, 5.3" in text
    assert "7.8" not in text


def test_a_file_from_before_the_fix_does_not_call_its_load_the_start(tmp_path: Path) -> None:
    _write(tmp_path, "sessions", "2026-12-02 15:49 UTC", [0.8, 1.2, 1.4], at_end=False)
    text = render(tmp_path)
    assert "load average when its first file was written 0.8, 1.2, 1.4" in text
    assert "at the start" not in text


def test_a_listed_benchmark_run_again_later_is_named_apart(tmp_path: Path) -> None:
    _write(tmp_path, "sessions", "2026-12-02 15:49 UTC", [0.8, 1.2, 1.4], at_end=True)
    _write(tmp_path, "density", "2026-12-03 21:32 UTC", [3.1, 2.0, 1.0], at_end=True)
    text = _render_run(tmp_path, ["sessions", "density"])
    assert "- date 2026-12-02 15:49 UTC; load average at the start 0.8, 1.2, 1.4" in text
    assert "- density was run apart from that run: 2026-12-03 21:32 UTC" in text
    assert "load average at the start 3.1, 2.0, 1.0" in text


def test_a_file_run_apart_on_another_cpu_or_python_names_them(tmp_path: Path) -> None:
    _write(tmp_path, "sessions", "2026-12-02 15:49 UTC", [0.8, 1.2, 1.4], at_end=True)
    _write(tmp_path, "density-500", "2026-12-03 16:59 UTC", [5.7, 6.1, 5.3], at_end=True)
    _write(tmp_path, "model-proxy", "2026-12-03 17:30 UTC", [1.0, 1.0, 1.0], at_end=True)
    for name, cpu, python in (("sessions", "CPU", "3.11.2 (/usr/bin/python3.11)"),
                              ("density-500", "Other CPU", "3.11.7 (/opt/py/bin/python3.11)"),
                              ("model-proxy", "CPU", "3.11.2 (/usr/bin/python3.11)")):  # fmt: skip
        path = tmp_path / f"bench-{name}.json"
        doc = json.loads(path.read_text())
        doc["machine"].update(cpu=cpu, python=python)
        path.write_text(json.dumps(doc))
    text = _render_run(tmp_path, ["sessions"])
    assert "; Python 3.11.2 (/usr/bin/python3.11); runsc r;" in text
    assert (
        "- density-500 was run apart from that run: 2026-12-03 16:59 UTC, kernel k, "
        "CPU Other CPU, Python 3.11.7 (/opt/py/bin/python3.11), load average at the start"
    ) in text
    # Same CPU and interpreter as the run: only the date, kernel and load.
    assert "- model-proxy was run apart from that run: 2026-12-03 17:30 UTC, kernel k, load" in text


def test_a_figure_beside_a_baseline_of_zero_prints_no_ratio() -> None:
    zero = figure("cpu", {"median": 0.05}, "idle", {"median": 0.0}, unit="% of a core")
    assert zero["ratio"] is None
    assert one_line(zero) == "cpu: 0.05 % of a core vs idle 0.0 % of a core"
    some = figure("cpu", {"median": 0.5}, "idle", {"median": 0.25}, unit="% of a core")
    assert one_line(some).endswith("(2.0x)")


def _run_record(results: Path, benchmarks: list[str], **more: Any) -> None:
    run = {"seconds": 700, "benchmarks": benchmarks, "failed": [], "note": "", **more}
    (results / "bench-run.json").write_text(json.dumps(run))


def test_a_file_from_before_the_run_is_named_apart_and_does_not_displace_the_run(
    tmp_path: Path,
) -> None:
    # model_proxy failed this run before writing: its file is the day before's.
    _write(tmp_path, "model-proxy", "2026-12-01 10:00 UTC", [4.0, 4.0, 4.0], at_end=True)
    _write(tmp_path, "sessions", "2026-12-02 15:49 UTC", [0.8, 1.2, 1.4], at_end=True)
    _write(tmp_path, "egress", "2026-12-02 15:55 UTC", [0.5, 0.5, 0.5], at_end=True)
    _run_record(tmp_path, ["sessions", "egress", "model_proxy"], started="2026-12-02 15:48 UTC")
    text = render(tmp_path)
    assert "- date 2026-12-02 15:49 UTC; load average at the start 0.8, 1.2, 1.4" in text
    assert "- model-proxy was run apart from that run: 2026-12-01 10:00 UTC" in text
    assert "sessions was run apart" not in text
    assert "egress was run apart" not in text


def test_a_benchmark_that_failed_in_the_run_is_not_the_runs_even_without_its_start(
    tmp_path: Path,
) -> None:
    # A record written before the run's start was recorded: the failed list still tells.
    _write(tmp_path, "model-proxy", "2026-12-01 10:00 UTC", [4.0, 4.0, 4.0], at_end=True)
    _write(tmp_path, "sessions", "2026-12-02 15:49 UTC", [0.8, 1.2, 1.4], at_end=True)
    _run_record(tmp_path, ["sessions", "model_proxy"], failed=["model_proxy"])
    text = render(tmp_path)
    assert "- date 2026-12-02 15:49 UTC; load average at the start 0.8, 1.2, 1.4" in text
    assert "- model-proxy was run apart from that run: 2026-12-01 10:00 UTC" in text
    assert "sessions was run apart" not in text


def test_a_file_without_a_date_is_not_taken_for_the_runs(tmp_path: Path) -> None:
    _write(tmp_path, "sessions", "2026-12-02 15:49 UTC", [0.8, 1.2, 1.4], at_end=True)
    old = {"calls": 100, "warm": {"supervisor": {"median_ms": 2.1, "p90_ms": 2.5}}}
    (tmp_path / "bench-mcp.json").write_text(json.dumps(old))
    _run_record(tmp_path, ["sessions", "mcp"], started="2026-12-02 15:48 UTC")
    text = render(tmp_path)
    assert "- mcp has no date: its figures are not known to be from that run" in text
