"""benchmarks/sessions.py: ``ironctl status`` beside ``systemctl status``. A call that failed is
not a timing: a refused or broken ``ironctl status`` ends fast, and would pass for a fast one."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from benchmarks import sessions


@pytest.mark.parametrize("failing", ["ironctl", "systemctl"])
def test_a_status_call_that_fails_stops_the_benchmark(
    monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[bytes]:
        code = 1 if argv[0] == failing else 0
        return subprocess.CompletedProcess(argv, code, b"", b"ironctl: cannot reach the daemon")

    monkeypatch.setattr(sessions, "STATUS_ROUNDS", 2)
    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(SystemExit, match=failing):
        sessions.status_ways()


def test_status_calls_that_succeed_are_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[bytes]:
        seen.append(argv[0])
        return subprocess.CompletedProcess(argv, 0, b"", b"")

    monkeypatch.setattr(sessions, "STATUS_ROUNDS", 2)
    monkeypatch.setattr(subprocess, "run", run)
    samples = sessions.status_ways()
    assert sorted(samples) == ["ctl_status", "systemctl_status"]
    assert [len(v) for v in samples.values()] == [2, 2]  # the warm-up round left out
    assert seen.count("ironctl") == seen.count("systemctl") == 3
