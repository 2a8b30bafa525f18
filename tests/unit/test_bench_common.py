"""Result files of the benchmarks that write their own shape (mcp, packages, channels) carry
the machine and its date, as write_result's do: benchmarks/table.py places a file in or out of
a run by that date."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import common


def test_a_file_of_its_own_shape_gets_the_machine_and_its_date(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = {"cpu": "CPU", "platform": "ptrace", "date": "2026-12-02 15:49 UTC"}
    monkeypatch.setattr(common, "machine", lambda: dict(facts))
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    out = common.write_doc("mcp", {"calls": 100, "warm": {}})
    assert out == tmp_path / "results" / "bench-mcp.json"
    doc = json.loads(out.read_text())
    assert doc == {"calls": 100, "warm": {}, "machine": facts}
    # A benchmark's own facts (channels: the sandboxes' platform) win over the common ones.
    own = common.write_doc("channels", {"machine": {"platform": "systrap", "load": 1.0}})
    assert json.loads(own.read_text())["machine"] == {**facts, "platform": "systrap", "load": 1.0}
