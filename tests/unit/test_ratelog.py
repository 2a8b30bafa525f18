"""Journal lines a box can cause are bounded per (session, kind) and the gap is counted
(ironclawd/ratelog.py), and a session socket's connection table drops the least recently used
connection, idle ones first, so a new connection always gets in (ironclawd/api/limits.py)."""

from __future__ import annotations

import logging

import pytest

from ironclawd.api.limits import Conn, ConnectionTable, TokenBucket
from ironclawd.ratelog import MAX_KEYS, LogThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logger(caplog: pytest.LogCaptureFixture) -> logging.Logger:
    caplog.set_level(logging.INFO, logger="test.ratelog")
    return logging.getLogger("test.ratelog")


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.ratelog"]


def test_first_n_per_window_then_one_summary(
    logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    throttle = LogThrottle(per_window=3, window_seconds=60, clock=clock)
    admitted = [
        throttle.log(logger, logging.WARNING, "s1", "bad", "bad %d", n) for n in range(1000)
    ]
    assert admitted == [True] * 3 + [False] * 997
    # Another session and another kind have windows of their own.
    assert throttle.log(logger, logging.WARNING, "s2", "bad", "bad s2")
    assert throttle.log(logger, logging.WARNING, "s1", "other", "other s1")
    assert messages(caplog) == ["bad 0", "bad 1", "bad 2", "bad s2", "other s1"]
    assert throttle.flush() == 0  # no window is over yet
    clock.now += 60
    assert throttle.flush() == 1  # only s1/bad dropped anything
    summary = caplog.records[-1]
    assert summary.getMessage() == "session s1: suppressed 997 similar messages (bad) in 60 s"
    assert summary.levelno == logging.WARNING
    assert summary.IRONCLAW_SUPPRESSED == 997  # type: ignore[attr-defined]
    assert throttle.log(logger, logging.WARNING, "s1", "bad", "bad again")
    assert messages(caplog)[-1] == "bad again"


def test_the_summary_comes_with_the_next_line_without_a_flush(
    logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    throttle = LogThrottle(per_window=1, window_seconds=10, clock=clock)
    for _ in range(5):
        throttle.log(logger, logging.INFO, "s1", "k", "line")
    clock.now += 10
    throttle.log(logger, logging.INFO, "s1", "k", "later")
    assert messages(caplog) == [
        "line",
        "session s1: suppressed 4 similar messages (k) in 10 s",
        "later",
    ]
    assert caplog.records[0].IRONCLAW_SID == "s1"  # type: ignore[attr-defined]


def test_keys_are_bounded(logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    throttle = LogThrottle(per_window=1, window_seconds=60, clock=Clock())
    for n in range(MAX_KEYS + 10):
        throttle.log(logger, logging.INFO, f"s{n}", "k", "x")
        throttle.log(logger, logging.INFO, f"s{n}", "k", "x")
    # The oldest keys were forgotten, each with its summary line: nothing is lost silently.
    assert len(throttle._keys) == MAX_KEYS
    assert sum("suppressed 1 similar" in m for m in messages(caplog)) == 10


def test_a_full_table_drops_the_least_recently_used_idle_connection() -> None:
    clock = Clock()
    closed: list[str] = []

    def conn(name: str) -> Conn:
        clock.now += 1
        return Conn(close=lambda: closed.append(name), clock=clock)

    table = ConnectionTable(3)
    agent, idle1, idle2 = conn("agent"), conn("idle1"), conn("idle2")
    for c in (agent, idle1, idle2):
        assert table.admit(c) is None
    clock.now += 1
    agent.call_started()  # the agent's channel is in use: the newest use of all
    assert table.admit(conn("new1")) is idle1
    assert table.admit(conn("new2")) is idle2
    # Idle ones go first even when the busy one is older in use.
    clock.now += 100
    assert table.admit(conn("new3")).closed  # type: ignore[union-attr]
    assert "agent" not in closed
    assert closed == ["idle1", "idle2", "new1"]
    assert len(table) == 3
    table.close_all()
    assert len(table) == 0
    assert "agent" in closed


def test_when_every_connection_is_busy_the_least_recently_used_goes() -> None:
    clock = Clock()
    closed: list[str] = []
    table = ConnectionTable(2)
    a = Conn(close=lambda: closed.append("a"), clock=clock)
    b = Conn(close=lambda: closed.append("b"), clock=clock)
    table.admit(a)
    table.admit(b)
    clock.now += 1
    a.call_started()
    clock.now += 1
    b.call_started()
    assert table.admit(Conn(close=lambda: None, clock=clock)) is a
    assert closed == ["a"]


def test_token_bucket_allows_bursts_then_the_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=2, burst=4, clock=clock)
    assert [bucket.take() for _ in range(6)] == [True] * 4 + [False] * 2
    clock.now += 1
    assert [bucket.take() for _ in range(3)] == [True, True, False]
