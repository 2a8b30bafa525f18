"""benchmarks/pool.py waits, untimed, before every round of every way (pooled and cold alike)
until the pool is full again. It waited for one ready sandbox before pooled rounds only, so
the refill of the other ran into the next round, often the cold twin's, slowing the baseline
the pooled figure is divided by (found by a review of the benchmarks, stop 50)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import pool
from ironclaw.admin.v1 import admin_pb2


class Stub:
    """GetStatus answers the pool filling by one sandbox a call; counts the calls."""

    def __init__(self, start: int) -> None:
        self.ready, self.calls = start, 0

    def GetStatus(self, request: Any, timeout: float) -> admin_pb2.GetStatusResponse:
        self.calls += 1
        answer = admin_pb2.GetStatusResponse(
            pool=[admin_pb2.PoolRow(agent=pool.POOLED, ready=self.ready)]
        )
        self.ready += 1
        return answer


def test_it_waits_for_the_whole_pool_not_one_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("benchmarks.pool.time.sleep", lambda s: None)
    stub = Stub(start=1)
    pool.wait_ready(stub)  # type: ignore[arg-type]
    assert stub.calls == pool.POOL_SIZE  # 1 ready, then 2: full


def test_every_way_waits_before_its_round(monkeypatch: pytest.MonkeyPatch) -> None:
    waited: list[str] = []
    monkeypatch.setattr(pool, "wait_ready", lambda stub: waited.append("wait"))

    def stop(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("timed work starts here")

    monkeypatch.setattr(pool, "ctl", stop)
    monkeypatch.setattr(pool, "chat", stop)
    stub = type("S", (), {"CreateSession": stop})()
    for name, way in pool.ways(stub).items():
        with pytest.raises(RuntimeError, match="timed work"):
            way(0)
        assert waited.pop() == "wait", name
