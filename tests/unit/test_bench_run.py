"""``make bench`` puts the daemon's state and the baselines' files on the checkout's disk
(benchmarks/run.py), and every result names the filesystem it ran on (benchmarks/common.py)."""

from __future__ import annotations

import datetime
import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from benchmarks import run, table
from benchmarks.common import DATE_FORMAT, filesystem_of

# /proc/self/mountinfo inside scripts/with-systemd with the bench's bind: an overlay root on a
# tmpfs, /var/lib/ironclaw bound from the disk, a session's outbound tmpfs below it.
MOUNTINFO = """\
100 1 0:50 / / rw,relatime - overlay overlay rw,lowerdir=/,upperdir=/x/upper
101 100 0:51 / /tmp rw,nosuid,nodev - tmpfs tmpfs rw
102 100 254:0 /work/main/build/bench-state/lib /var/lib/ironclaw rw - ext4 /dev/vda rw
103 102 0:60 / /var/lib/ironclaw/queues/abc/outbound rw - tmpfs tmpfs rw,size=65536k
104 100 254:0 /a\\040b /srv/a\\040b rw - xfs /dev/vdb rw
"""


def test_the_filesystem_is_the_longest_mount_point_holding_the_path() -> None:
    assert filesystem_of("/var/lib/ironclaw", MOUNTINFO) == "ext4 (/dev/vda)"
    assert filesystem_of("/var/lib/ironclaw/state.db", MOUNTINFO) == "ext4 (/dev/vda)"
    assert filesystem_of("/var/lib/ironclaw/queues/abc/outbound/o.db", MOUNTINFO) == (
        "tmpfs (tmpfs)"
    )
    assert filesystem_of("/var/lib/ironclawx", MOUNTINFO) == "overlay (overlay)"
    assert filesystem_of("/tmp/x", MOUNTINFO) == "tmpfs (tmpfs)"
    assert filesystem_of("/srv/a b/c", MOUNTINFO) == "xfs (/dev/vdb)"


def test_the_run_binds_the_state_to_disk_first_and_clears_it_before_and_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = tmp_path / "bench state"
    (where / "lib").mkdir(parents=True)
    (where / "lib" / "left-over").write_text("from an earlier run")
    seen: dict[str, Any] = {}

    def call(argv: list[str], cwd: Path) -> int:
        seen["argv"], seen["existed"] = argv, (where / "lib" / "left-over").exists()
        (where / "lib").mkdir(parents=True)  # what the run leaves
        (where / "lib" / "audit.log").write_text("")
        return 0

    monkeypatch.setattr(run, "DISK_STATE", where)
    chattr: list[list[str]] = []
    monkeypatch.setattr(subprocess, "call", call)
    monkeypatch.setattr(subprocess, "run", lambda argv, **_: chattr.append(argv))
    monkeypatch.setattr(run, "ROOT", tmp_path)
    monkeypatch.setattr(run, "RESULTS", tmp_path / "results")  # never the checkout's results/
    monkeypatch.setattr(table, "main", lambda: None)
    assert run.main(["egress"]) == 0
    inner = seen["argv"][-1]
    bind = run.state_on_disk(where)
    assert inner.startswith(bind + " && scripts/install-dev")
    assert f"mount --bind '{where}/lib' /var/lib/ironclaw" in bind
    assert f"export TMPDIR='{where}/tmp'" in bind
    assert seen["existed"] is False  # cleared before
    assert not where.exists()  # and after
    assert chattr == [["chattr", "-R", "-a", str(where)]] * 2  # the audit log's +a goes first
    record = json.loads((tmp_path / "results" / "bench-run.json").read_text())
    assert record["benchmarks"] == ["egress"]  # the record went where RESULTS points
    # When it began, in the result files' own form: the table keeps older files out of the run.
    began = datetime.datetime.strptime(record["started"], DATE_FORMAT)
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    assert datetime.timedelta(0) <= now - began < datetime.timedelta(minutes=2)


def test_paths_with_spaces_stay_one_word(tmp_path: Path) -> None:
    words = shlex.split(run.state_on_disk(tmp_path / "a b"))
    assert words[:4] == ["mkdir", "-p", f"{tmp_path}/a b/lib", f"{tmp_path}/a b/tmp"]
