"""The dataclass code cache in use (ironclawd/dataclass_cache.py): in fresh interpreters, where
``ironclawd`` installs it before any dataclass is made, and in ironclawd.service under a real
systemd, which names its file. No timings here: benchmarks/density.py measures the start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_daemon import cursor, journal_since, out, sh

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CACHE = "/var/cache/ironclaw/dataclasses.bin"

START = """
import json, sys
import ironclawd.daemon, ironclawd.wiring  # the daemon's imports before READY
from ironclawd import dataclass_cache
cache = dataclass_cache.ACTIVE
import dataclasses
print(json.dumps(None if cache is None else {
    "hits": cache.hits, "misses": cache.misses, "problem": cache.problem,
    "patched": dataclasses.exec == cache.exec, "saved": cache.save()}))
"""


def start(**env: str) -> Any:
    proc = subprocess.run(
        [sys.executable, "-I", "-c", START], capture_output=True, text=True, timeout=120,
        check=False, cwd=ROOT, env={k: v for k, v in {**os.environ, **env}.items() if v},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_second_start_compiles_no_dataclass_of_the_daemon(tmp_path: Path) -> None:
    path = str(tmp_path / "dataclasses.bin")
    first = start(IRONCLAW_DATACLASS_CACHE=path)
    assert first["patched"]
    assert first["saved"]
    assert first["problem"] == ""
    assert first["misses"] > 300  # ~650 with this checkout's daemon; the count is not the point
    second = start(IRONCLAW_DATACLASS_CACHE=path)
    assert second == {"hits": first["hits"] + first["misses"], "misses": 0, "problem": "",
                      "patched": True, "saved": False}  # fmt: skip


def test_without_the_variable_nothing_is_installed() -> None:
    assert start(IRONCLAW_DATACLASS_CACHE="") is None


def test_the_daemon_keeps_its_cache_root_only_and_uses_it(daemon: Any) -> None:
    """ironclawd.service writes the cache after READY (mode 0600 in a 0700 directory of root),
    and a start with the file compiles nothing and rewrites nothing."""
    # Written after READY, in the background: wait for it rather than race it.
    proc = sh(daemon, f"for i in $(seq 100); do [ -s {CACHE} ] && break; sleep 0.1; done; "
                      f"stat -c '%U %a %F' /var/cache/ironclaw {CACHE}")  # fmt: skip
    assert out(proc).split("\n")[:2] == ["root 700 directory", "root 600 regular file"]
    before = out(daemon.run(["stat", "-c", "%Y.%i", CACHE]))
    mark = cursor(daemon)
    assert daemon.run(["systemctl", "restart", "ironclawd"]).returncode == 0
    journal = journal_since(daemon, mark)
    assert "dataclass code cache" not in journal  # neither "written" nor "not used"
    assert out(daemon.run(["stat", "-c", "%Y.%i", CACHE])) == before


def test_the_daemon_replaces_a_file_it_cannot_trust(daemon: Any) -> None:
    proc = sh(daemon, textwrap.dedent(f"""
        chmod 0666 {CACHE} && systemctl restart ironclawd
        for i in $(seq 100); do [ "$(stat -c %a {CACHE})" = 600 ] && break; sleep 0.1; done
        stat -c %a {CACHE}
    """))  # fmt: skip
    assert out(proc).strip().endswith("600"), out(proc)
    journal = out(daemon.run(["journalctl", "--no-pager", "-o", "cat", "-u", "ironclawd", "-n",
                              "50"]))  # fmt: skip
    assert "not used: writable by others (mode 0666); writing a new one" in journal
