"""The private-systemd harness: it works, it leaves the host alone, and it cleans up after itself.

systemd at boot runs tmpfiles, sysusers and sysctl against whatever root it sees; on the real root
it wiped the host's /tmp. These tests are the reason anyone may trust `scripts/with-systemd`.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.harness.fixtures import OPTED_OUT
from tests.harness.private_systemd import (
    CGROUP_ROOT,
    PrivateSystemd,
    SystemdHarness,
)

pytestmark = pytest.mark.integration

SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/rp_filter",
    "kernel/pid_max",
    "kernel/core_pattern",
    "fs/inotify/max_user_instances",
    "fs/protected_regular",
    "fs/protected_fifos",
)
OLD = time.time() - 40 * 86400  # older than any tmpfiles age, so age-based cleaning would hit it

# Prints the memory limit of the cgroup the script runs in (cgroup v1 memory, else v2).
_OWN_MEMORY_LIMIT = r"""
v1=$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup)
if [ -n "$v1" ]; then cat "/sys/fs/cgroup/memory$v1/memory.limit_in_bytes"
else cat "/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)/memory.max"; fi
"""


def _sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _sysctls() -> dict[str, str]:
    return {name: (Path("/proc/sys") / name).read_text() for name in SYSCTLS}


def _settled_tmp_entries() -> set[str]:
    # Other processes on the machine create and delete their own fresh files in /tmp; entries
    # untouched for five minutes are the ones a cleaner would remove and nobody else will.
    cutoff = time.time() - 300
    entries = set()
    for entry in os.scandir("/tmp"):
        try:
            if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                entries.add(entry.name)
        except FileNotFoundError:
            continue
    return entries


def _require_private(sd: SystemdHarness) -> PrivateSystemd:
    if not isinstance(sd, PrivateSystemd):
        pytest.skip(f"{OPTED_OUT}runs against the host's systemd (IRONCLAW_USE_HOST_SYSTEMD=1)")
    return sd


def test_transient_units_run_and_their_limits_are_enforced(
    private_systemd: SystemdHarness,
) -> None:
    state = private_systemd.run(["systemctl", "is-system-running"]).stdout.decode().strip()
    assert state in ("running", "degraded")
    if state == "degraded" and isinstance(private_systemd, PrivateSystemd):
        # Units failed by earlier tests are theirs to explain; boot-time failures are ours.
        assert "systemd-journald.service" not in private_systemd.failed_units()

    r = private_systemd.run(["systemd-run", "--wait", "-q", "-p", "MemoryMax=64M", "true"])
    assert r.returncode == 0, r.stderr.decode()

    # systemd accepts MemoryMax= even where it cannot apply it: check the unit's own cgroup.
    r = private_systemd.run(
        [
            "systemd-run",
            "--wait",
            "--pipe",
            "-q",
            "-p",
            "MemoryMax=64M",
            "sh",
            "-c",
            _OWN_MEMORY_LIMIT,
        ]
    )
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().strip() == str(64 * 1024 * 1024)


def test_boot_leaves_host_tmp_etc_and_sysctls_untouched(
    private_systemd_factory: Callable[[], SystemdHarness],
) -> None:
    canary_dir = Path("/tmp") / f"ironclaw-canary-{uuid.uuid4().hex}"
    canary_dir.mkdir()
    try:
        for name in ("a", "b", ".hidden"):
            (canary_dir / name).write_text(name)
        canary = Path("/tmp") / f"{canary_dir.name}.file"
        canary.write_text("still here")
        for path in (*canary_dir.iterdir(), canary_dir, canary):
            os.utime(path, (OLD, OLD))
        tmp_before = _settled_tmp_entries()
        assert canary.name in tmp_before
        hashes_before = {p: _sha256(p) for p in ("/etc/passwd", "/etc/group", "/etc/shadow")}
        sysctls_before = _sysctls()

        sd = _require_private(private_systemd_factory())
        # Writes inside land in the overlay, not on the host.
        sd.run(["sh", "-c", "echo inside > /etc/ironclaw-harness-probe"], check=True)
        assert not Path("/etc/ironclaw-harness-probe").exists()
        sd.close()

        missing = tmp_before - set(os.listdir("/tmp"))
        assert not missing, f"host /tmp lost {sorted(missing)}"
        assert canary.read_text() == "still here"
        assert sorted(p.name for p in canary_dir.iterdir()) == [".hidden", "a", "b"]
        assert {p: _sha256(p) for p in hashes_before} == hashes_before
        assert _sysctls() == sysctls_before
    finally:
        for path in canary_dir.iterdir():
            path.unlink()
        canary_dir.rmdir()
        Path(f"{canary_dir}.file").unlink(missing_ok=True)


def test_close_removes_mounts_processes_and_cgroups(
    private_systemd_factory: Callable[[], SystemdHarness],
) -> None:
    sd = _require_private(private_systemd_factory())
    sd.run(["systemd-run", "-q", "--unit=ironclaw-harness-sleeper", "sleep", "600"], check=True)
    procs = CGROUP_ROOT / "systemd" / sd.cgroup_rel.lstrip("/")
    procs = procs / "system.slice" / "ironclaw-harness-sleeper.service" / "cgroup.procs"
    if not procs.exists():  # unified-only host
        procs = CGROUP_ROOT / sd.cgroup_rel.lstrip("/") / "system.slice"
        procs = procs / "ironclaw-harness-sleeper.service" / "cgroup.procs"
    sleeper = int(procs.read_text().split()[0])  # host PID of a process in a unit inside
    assert Path(f"/proc/{sleeper}").exists()
    pid, state_dir = sd.pid, sd.state_dir
    started = {p: _start_time(p) for p in (pid, sleeper)}

    sd.close()
    sd.close()  # idempotent

    mountinfo = Path("/proc/self/mountinfo").read_text()
    assert str(state_dir) not in mountinfo
    assert not state_dir.exists()
    for gone, start in started.items():
        assert _start_time(gone) != start, f"pid {gone} survived close()"
    leftovers = [p for p in CGROUP_ROOT.glob(f"*/{sd.cgroup_rel.lstrip('/')}") if p.exists()]
    assert not leftovers, leftovers


def _start_time(pid: int) -> str | None:
    """Start time of `pid` (proc(5) field 22): tells our process from a later one reusing it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def test_run_as_user_uses_private_accounts(private_systemd: SystemdHarness) -> None:
    sd = _require_private(private_systemd)
    passwd_before, group_before = _sha256("/etc/passwd"), _sha256("/etc/group")
    user = f"ict{uuid.uuid4().hex[:8]}"
    sd.run(["groupadd", f"{user}-extra"], check=True)
    sd.run(["useradd", "--create-home", "--groups", f"{user}-extra", user], check=True)

    uid = sd.run(["id", "-u", user], check=True).stdout.decode().strip()
    r = sd.run(["sh", "-c", 'id -u; id -Gn; echo "$HOME"'], user=user, check=True)
    own_uid, groups, home = r.stdout.decode().splitlines()
    assert own_uid == uid != "0"
    assert f"{user}-extra" in groups.split()
    assert home == f"/home/{user}"
    # Privileges are really dropped, not only reported.
    denied = sd.run(["cat", "/etc/shadow"], user=user)
    assert denied.returncode != 0

    assert user not in Path("/etc/passwd").read_text()
    assert (_sha256("/etc/passwd"), _sha256("/etc/group")) == (passwd_before, group_before)
    assert user in sd.host_path("/etc/passwd").read_text()
