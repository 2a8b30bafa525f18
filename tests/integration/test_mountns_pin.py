"""The outbound mount namespace is pinned even when the kernel gives it a lower id than the
daemon's own namespace (host/mountns.py, ``OutboundSpace._pin``).

Linux refuses (EINVAL) to bind a mount namespace's file into a namespace whose id is not lower:
its guard against loops. Since 6.18 those ids come from per-CPU batches, so a namespace made
later on another CPU can have the lower id. One daemon start in ten failed so under the test
harness: "outbound mount namespace: pinning at /run/ironclaw/mntns/ns: Invalid argument".

The scenario makes that case on purpose, in a private mount namespace of its own. It finds the
CPU whose batch is lower, makes the process's namespace on the other CPU (so it has the higher
id), then starts the space with the process confined to the lower CPU. The namespace the
space's thread makes first then has the lower id. The kernel's ids are read with
``NS_GET_MNTNS_ID``, which shows that the case was made rather than assumed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = r"""
import ctypes, fcntl, json, logging, os, struct, sys, threading
from ironclawd.host.mountns import OutboundSpace, THREAD_NAME
from pathlib import Path

NS_GET_MNTNS_ID = 0x8008B705  # _IOR(0xb7, 0x5, __u64), linux/nsfs.h
libc = ctypes.CDLL(None, use_errno=True)
base = Path(sys.argv[1])
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")

def ns_id(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = bytearray(8)
        fcntl.ioctl(fd, NS_GET_MNTNS_ID, buf)
        return struct.unpack("Q", buf)[0]
    finally:
        os.close(fd)

def new_ns_on(cpu):
    os.sched_setaffinity(0, {cpu})
    assert libc.unshare(0x20000) == 0, os.strerror(ctypes.get_errno())
    return ns_id("/proc/self/ns/mnt")

ids = {cpu: new_ns_on(cpu) for cpu in sorted(os.sched_getaffinity(0))}
low, high = min(ids, key=ids.get), max(ids, key=ids.get)
own = new_ns_on(high)  # the namespace the space starts from: the higher batch's newest id
assert libc.mount(b"t", str(base).encode(), b"tmpfs", 0, b"size=1m") == 0
os.sched_setaffinity(0, {low})  # the space's thread inherits this: it starts on the lower CPU
space = OutboundSpace(base / "mntns", base / "queues")
space.start()
tid = next(t.native_id for t in threading.enumerate() if t.name == THREAD_NAME)
print(json.dumps({
    "ids": ids, "low": low, "high": high, "own": own,
    "pinned": ns_id(str(space.pin)), "thread": ns_id(f"/proc/self/task/{tid}/ns/mnt"),
    "joined": space.joined,
}))
"""


def test_a_namespace_given_the_lower_id_is_renewed_and_pinned(tmp_path: Path) -> None:
    assert len(os.sched_getaffinity(0)) >= 2, "the case needs two CPUs to make"
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", SCENARIO,
         str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    # The case was made: the two CPUs hand out ids from different batches, the lower CPU's
    # below the namespace the space started from.
    assert r["low"] != r["high"], r
    assert r["ids"][str(r["low"])] < r["own"], r
    # ...and met: the space renewed its namespace until the kernel took the pin.
    assert "pinned once renewed on CPU" in proc.stderr, proc.stderr
    assert r["joined"] is False, r
    assert r["pinned"] == r["thread"] > r["own"], r
