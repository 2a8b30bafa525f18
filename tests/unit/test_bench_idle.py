"""The idle figures of benchmarks/pool.py and benchmarks/density.py are read from the processes
of the sandboxes' units. No process found is a failed step, not a sandbox idling at 0%."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import density, pool


class _Stub:
    def __init__(self) -> None:
        self.removed: list[str] = []

    def CreateSession(self, request: Any, timeout: float) -> Any:
        return SimpleNamespace(session=SimpleNamespace(sid=f"idle{len(self.removed)}"))

    def RemoveSession(self, request: Any) -> None:
        self.removed.append(request.sid)


def _quiet(monkeypatch: pytest.MonkeyPatch, pids: dict[str, list[int]]) -> _Stub:
    monkeypatch.setattr(pool, "ready_pooled_sids", lambda agent: ["pool0001", "pool0002"])
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    monkeypatch.setattr(pool, "cpu_ticks", lambda pid: 0)
    monkeypatch.setattr(
        pool, "sandbox_pids", lambda sids: pids["pooled" if "pool0001" in sids else "idle"]
    )
    return _Stub()


@pytest.mark.parametrize("none_for", ["pooled", "idle"])
def test_a_waiting_cpu_without_processes_is_no_figure(
    monkeypatch: pytest.MonkeyPatch, none_for: str
) -> None:
    pids = {"pooled": [10, 11], "idle": [20, 21], none_for: []}
    stub = _quiet(monkeypatch, pids)
    with pytest.raises(SystemExit, match="no process"):
        pool.waiting_cpu(stub)  # type: ignore[arg-type]
    assert len(stub.removed) == 2  # the idle sessions are removed all the same


def test_a_waiting_cpu_with_processes_is_a_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = _quiet(monkeypatch, {"pooled": [10, 11], "idle": [20, 21]})
    [figure] = pool.waiting_cpu(stub)  # type: ignore[arg-type]
    assert figure["value"] == {"median": 0.0}
    assert figure["baseline"] == {"median": 0.0}


def test_density_reads_no_figure_from_no_process() -> None:
    with pytest.raises(SystemExit, match="no process found in the units of 10 sessions"):
        density.require_pids([], "10 sessions")
    assert density.require_pids([1, 2, 3], "10 sessions") == [1, 2, 3]
