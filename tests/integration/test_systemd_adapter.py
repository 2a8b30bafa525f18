"""host/systemd.py (and host/netns.py) inside the private systemd, through systemd_driver.py.

The adapters must run inside: the private systemd has its own /run (D-Bus socket, /run/netns).
Each driver call is one short Python process in there that prints one JSON object.
"""

from __future__ import annotations

import json
import secrets
import statistics
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.integration

DRIVER = [".venv/bin/python", "tests/integration/systemd_driver.py"]
MIB = 1 << 20


def drive(sysd: Any, *args: str) -> dict[str, Any]:
    proc = sysd.run([*DRIVER, *args], timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    result: dict[str, Any] = json.loads(proc.stdout.decode().splitlines()[-1])
    return result


def ok(sysd: Any, *args: str) -> dict[str, Any]:
    result = drive(sysd, *args)
    assert "error" not in result, result
    return result


def show(sysd: Any, unit: str, *props: str) -> dict[str, str]:
    proc = sysd.run(["systemctl", "show", unit, "-p", ",".join(props)], check=True)
    return dict(line.split("=", 1) for line in proc.stdout.decode().splitlines() if "=" in line)


def sh(sysd: Any, script: str) -> str:
    proc = sysd.run(["sh", "-c", script], check=True)
    return str(proc.stdout.decode().strip())


@pytest.fixture(scope="module")
def netns(private_systemd: Any) -> Iterator[str]:
    """An empty netns made by the adapter inside the private systemd (its /run is private)."""
    name = f"ironclaw-test-{secrets.token_hex(4)}"
    assert ok(private_systemd, "netns-create", name)["path"] == f"/run/netns/{name}"
    try:
        yield name
    finally:
        assert ok(private_systemd, "netns-delete", name) == {"exists": False}


@pytest.fixture
def unit(private_systemd: Any) -> Iterator[str]:
    """A fresh unit name; stopped and reset afterwards whatever happened."""
    name = f"ironclaw-sbx-test-{secrets.token_hex(4)}.service"
    yield name
    private_systemd.run(["systemctl", "stop", name], timeout=30)
    private_systemd.run(["systemctl", "reset-failed", name], timeout=30)


def start(sysd: Any, unit: str, netns: str, *argv: str, collect: str = "inactive-or-failed",
          memory: int = 64 * MIB) -> dict[str, Any]:  # fmt: skip
    return drive(sysd, "start", unit, f"/run/netns/{netns}", collect, str(memory), "10", "--",
                 *argv)  # fmt: skip


def test_unit_runs_with_its_limits_inside_the_empty_netns(
    private_systemd: Any, netns: str, unit: str
) -> None:
    started = start(private_systemd, unit, netns, "/bin/sleep", "300")
    assert started["state"]["active_state"] == "active", started
    assert started["seconds"] < 10  # the job wait returned within its timeout
    names = ("MemoryMax", "TasksMax", "CPUQuotaPerSecUSec", "NetworkNamespacePath", "Slice",
             "CollectMode", "KillMode", "Type", "MainPID")  # fmt: skip
    props = show(private_systemd, unit, *names)
    assert props == {
        "MemoryMax": str(64 * MIB), "TasksMax": "32", "CPUQuotaPerSecUSec": "500ms",
        "NetworkNamespacePath": f"/run/netns/{netns}", "Slice": "ironclaw-test.slice",
        "CollectMode": "inactive-or-failed", "KillMode": "mixed", "Type": "exec",
        "MainPID": str(started["state"]["main_pid"]),
    }  # fmt: skip
    pid = props["MainPID"]
    in_unit = sh(private_systemd, f"stat -L -c %i /proc/{pid}/ns/net")
    assert in_unit == str(ok(private_systemd, "netns-inode", netns)["inode"])
    assert in_unit != sh(private_systemd, "stat -L -c %i /proc/self/ns/net")
    assert sh(private_systemd, f"nsenter -t {pid} -n ip -o link show | wc -l") == "1"
    listed = ok(private_systemd, "list", "ironclaw-sbx-test-*")["units"]
    assert [u["name"] for u in listed if u["name"] == unit] == [unit]

    stopped = ok(private_systemd, "stop", unit, "10")
    assert stopped["state"] is None  # stopped and collected: no unit left behind
    assert sh(private_systemd, f"systemctl list-units --all --plain --no-legend {unit}") == ""
    assert ok(private_systemd, "stop", unit, "10")["state"] is None  # stopping again is fine


def test_failed_start_names_the_unit_and_leaves_nothing(
    private_systemd: Any, netns: str, unit: str
) -> None:
    result = start(private_systemd, unit, netns, "/nonexistent/runsc")
    assert result["error"] == "HostError"
    assert result["message"] == f"starting unit {unit}: job failed: failed"
    assert ok(private_systemd, "state", unit)["state"] is None


def test_memory_hog_is_killed_inside_its_unit_and_the_driver_survives(
    private_systemd: Any, netns: str, unit: str
) -> None:
    # Bounded: if MemoryMax were not enforced the hog stops at 512 MiB and exits 0.
    hog = "x=[]\nfor _ in range(512): x.append(b'x' * (1 << 20))\n"
    started = start(private_systemd, unit, netns, "/usr/bin/python3", "-c", hog,
                    collect="inactive")  # fmt: skip
    assert "error" not in started, started
    final = ok(private_systemd, "wait", unit, "30")["state"]
    assert final["active_state"] == "failed", final
    # systemd reports oom-kill only where it can read memory.events (cgroup v2); on a v1 memory
    # controller (this hybrid host) the kernel's OOM kill shows as SIGKILL.
    v2 = sh(private_systemd, "stat -fc %T /sys/fs/cgroup") == "cgroup2fs"
    assert final["result"] == "oom-kill" if v2 else final["result"] in ("oom-kill", "signal")
    assert show(private_systemd, unit, "ExecMainStatus")["ExecMainStatus"] == "9"
    assert ok(private_systemd, "reset", unit)["state"] is None  # reset_failed forgets it


def test_kill_then_wait_reports_the_signal(private_systemd: Any, netns: str, unit: str) -> None:
    assert "error" not in start(private_systemd, unit, netns, "/bin/sleep", "300",
                                collect="inactive")  # fmt: skip
    sh(private_systemd, f"systemctl kill -s KILL {unit}")  # the daemon never kills a unit itself
    final = ok(private_systemd, "wait", unit, "10")["state"]
    assert (final["active_state"], final["result"]) == ("failed", "signal")
    assert ok(private_systemd, "reset", unit)["state"] is None


def test_start_job_wait_timing(private_systemd: Any, netns: str) -> None:
    """Measured, not asserted beyond the timeout (docs/style.md §20): printed for the docs."""
    seconds = ok(private_systemd, "bench", "9", f"/run/netns/{netns}")["seconds"]
    assert all(s < 10 for s in seconds)
    print(f"\ntransient unit start -> job done: median {statistics.median(seconds) * 1e3:.1f} ms, "
          f"max {max(seconds) * 1e3:.1f} ms over {len(seconds)}")  # fmt: skip
