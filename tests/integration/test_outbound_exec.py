"""The sandbox unit's wrapper (host/outbound_exec.py, run by the command line
``OutboundSpace.exec_argv`` builds, the clone on standard input as systemd hands it over):
it mounts a nosuid,nodev,noexec tmpfs clone on the outbound directory and then execs what
follows (runsc); anything else ends it with status 1 and a line on stderr, and what follows
never runs: a unit whose wrapper failed never leaves the host's disk directory, which has no
quota, as the box's outbound queue. Run in a private mount namespace (``unshare -m``) of
their own; the real daemon's units are in tests/integration/test_outbound_namespace.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ironclawd.host import mountns

pytestmark = pytest.mark.integration

# Inside `unshare -m --propagation private`: make the source (a tmpfs with the given options,
# or a plain directory), clone it as the daemon does, run the unit's command line with the
# clone as standard input and `touch <target>/ran` as "runsc"; report what happened.
SCENARIO = r"""
import ctypes, json, os, subprocess, sys
req = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
src, target = req["src"], req["target"]
if req["options"] is not None:
    flags = sum({"nosuid": 2, "nodev": 4, "noexec": 8}[o] for o in req["flags"])
    assert libc.mount(b"t", src.encode(), b"tmpfs", flags, req["options"].encode()) == 0
    open(os.path.join(src, "from-host"), "w").write("x")
fd = libc.syscall(428, -100, src.encode(), 1 | 0o2000000)  # open_tree(OPEN_TREE_CLONE)
assert fd >= 0, os.strerror(ctypes.get_errno())
proc = subprocess.run(req["argv"], stdin=fd, capture_output=True, text=True, timeout=30)
seen = sorted(os.listdir(target))
kind = subprocess.run(["findmnt", "-rn", "-o", "FSTYPE", target], capture_output=True,
                      text=True).stdout.strip()
print(json.dumps({"rc": proc.returncode, "stderr": proc.stderr, "seen": seen, "kind": kind}))
"""


def run(tmp_path: Path, options: str | None, flags: tuple[str, ...] = ()) -> dict[str, object]:
    src, target = tmp_path / "src", tmp_path / "outbound"
    src.mkdir()
    target.mkdir()
    space = mountns.OutboundSpace(tmp_path / "pin", tmp_path)
    argv = space.exec_argv(target, ["/usr/bin/touch", str(target / "ran")])
    req = {"src": str(src), "target": str(target), "options": options, "flags": flags,
           "argv": argv}  # fmt: skip
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", SCENARIO,
         json.dumps(req)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def test_the_clone_is_mounted_then_runsc_runs_on_it(tmp_path: Path) -> None:
    r = run(tmp_path, "size=1m,mode=0755", ("nosuid", "nodev", "noexec"))
    assert r["rc"] == 0, r
    assert r["kind"] == "tmpfs", r
    assert r["seen"] == ["from-host", "ran"], r  # the host's file, and "runsc" wrote there


def test_a_plain_directory_is_refused_and_runsc_never_runs(tmp_path: Path) -> None:
    r = run(tmp_path, None)
    assert r["rc"] == 1, r
    assert "ironclaw outbound_exec: descriptor 3 is not a tmpfs" in str(r["stderr"]), r
    assert r["seen"] == [], r
    assert r["kind"] == "", r


def test_a_tmpfs_that_allows_exec_is_refused(tmp_path: Path) -> None:
    r = run(tmp_path, "size=1m", ("nosuid", "nodev"))
    assert r["rc"] == 1, r
    assert "not nosuid,nodev,noexec" in str(r["stderr"]), r
    assert r["seen"] == [], r
    assert r["kind"] == "", r
