"""The red-team probe's ``--probe-grep`` (redteam_probe/): finds needles anywhere in readable files,
including across its read blocks, without following symlinks or hanging on FIFOs; and the
agent's tool runner never raises, whatever the model's arguments."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.tools import run_tool
from redteam_probe import main as probe_main
from redteam_probe.probes import grep as agent_grep

NEEDLE = b"CANARY-grep-0123456789"


def test_grep_finds_needles_across_blocks_and_reports_them_by_hex(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "small").write_bytes(b"x" + NEEDLE + b"y")
    straddle = agent_grep._GREP_BLOCK - len(NEEDLE) // 2
    (tmp_path / "big").write_bytes(b"\0" * straddle + NEEDLE + b"\0" * 10)
    (tmp_path / "clean").write_bytes(NEEDLE[:-1])
    os.symlink("/nonexistent", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    report = agent_grep.grep_tree([NEEDLE, b"other"], str(tmp_path))
    assert report["hits"] == {
        NEEDLE.hex(): [str(tmp_path / "big"), str(tmp_path / "d" / "small")],
        b"other".hex(): [],
    }
    assert report["files"] == 3
    assert report["unreadable"] == 2  # the dangling symlink and the FIFO: skipped, not hung
    assert NEEDLE not in json.dumps(report).encode()


def test_probe_grep_arguments() -> None:
    assert probe_main._grep_needles([NEEDLE.hex()]) == [NEEDLE]
    for bad in (["zz"], [""]):
        with pytest.raises(ValueError, match="--probe-grep"):
            probe_main._grep_needles(bad)


def test_tools_never_raise_whatever_the_model_sends(tmp_path: Path) -> None:
    assert run_tool("write_file", "[" * 100_000).startswith("error: write_file failed")
    assert run_tool("nosuch", "{}") == "error: unknown tool 'nosuch'"
    assert run_tool("read_file", "[1]") == "error: arguments must be a JSON object"
    result = run_tool("read_file", json.dumps({"path": "\udcff"}))
    assert result.startswith("error:")
    result.encode("utf-8")  # encodable, so it can go back to the model
