"""How far systemd confines the daemon and a real sandbox unit (units/ironclawd.service,
ironclawd/host/hardening.py): ``systemd-analyze security`` scores both, the scores and tables
are printed and written to results/unit-security.json, and every key setting is checked twice:
as systemd reports it (``systemctl show``) and as the kernel enforces it on the running main
process (``/proc/<pid>/status``: bounding set, no_new_privs, seccomp).

A score is a pure function of a unit's settings, so the bounds below are regression guards: a
change that loosens a setting raises the score and fails here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from ironclawd.host import hardening
from tests.harness.fixtures import RESULTS
from tests.harness.private_systemd import SystemdHarness

pytestmark = pytest.mark.integration

DAEMON = "ironclawd.service"
# was 9.3 before hardening; 4.6 until the outbound tmpfs moved into a mount namespace of the
# daemon's own (+0.1: RestrictNamespaces= allows mnt and CAP_SYS_CHROOT is kept, to setns into
# it; for a root process with CAP_SYS_ADMIN neither grants more; host/mountns.py).
MAX_DAEMON_SCORE = 4.7
MAX_SANDBOX_SCORE = 3.0  # was 9.6 before hardening
DAEMON_CAPS = {
    "cap_chown", "cap_dac_override", "cap_dac_read_search", "cap_fowner", "cap_kill",
    "cap_linux_immutable", "cap_sys_admin", "cap_sys_chroot",
}  # fmt: skip
_OVERALL = re.compile(r"Overall exposure level for (\S+): (\d+\.\d+) (\S+)")
_ROW = re.compile(r"^([✓✗]) (\S+)\s+(.*?)\s*(\d+\.\d+)?$")


def _out(proc: Any) -> str:
    return bytes(proc.stdout or b"").decode() + bytes(proc.stderr or b"").decode()


def analyze(sysd: SystemdHarness, unit: str) -> dict[str, Any]:
    """``systemd-analyze security UNIT``: its score, verdict and table."""
    proc = sysd.run(["systemd-analyze", "security", "--no-pager", unit])
    text = _out(proc)
    m = _OVERALL.search(text)
    assert m is not None, text
    assert m.group(1) == unit, text
    rows = []
    for line in text.splitlines():
        row = _ROW.match(line.strip())
        if row:
            mark, name, what, exposure = row.groups()
            rows.append({"setting": name, "ok": mark == "✓", "description": what,
                         "exposure": float(exposure) if exposure else 0.0})  # fmt: skip
    return {"unit": unit, "score": float(m.group(2)), "verdict": m.group(3), "rows": rows,
            "text": text}  # fmt: skip


def show(sysd: SystemdHarness, unit: str, *names: str) -> dict[str, str]:
    proc = sysd.run(["systemctl", "show", unit, *(f"-p{n}" for n in names)])
    assert proc.returncode == 0, _out(proc)
    return dict(line.split("=", 1) for line in _out(proc).splitlines() if "=" in line)


def status(sysd: SystemdHarness, pid: str) -> dict[str, str]:
    """/proc/<pid>/status of a process inside the private systemd."""
    proc = sysd.run(["cat", f"/proc/{pid}/status"])
    assert proc.returncode == 0, _out(proc)
    return {k: v.strip() for k, _, v in (ln.partition(":") for ln in _out(proc).splitlines())}


def assert_devices_closed(sysd: SystemdHarness, pid: str) -> None:
    """The device cgroup of ``pid`` (v1 here; v2 uses a BPF program with nothing to read):
    writable only the pseudo devices (mem 1:*, tty 5:*, pts 136:*; the rtc read-only for
    ProtectClock=), never "a *:* rwm", never a block device."""
    for line in _out(sysd.run(["cat", f"/proc/{pid}/cgroup"])).splitlines():
        _, controllers, path = line.split(":", 2)
        if "devices" in controllers.split(","):
            listed = _out(sysd.run(["cat", f"/sys/fs/cgroup/devices{path}/devices.list"]))
            entries = [e.split() for e in listed.splitlines()]
            majors = {e[1].split(":")[0] for e in entries if e[0] == "c" and "w" in e[2]}
            assert not [e for e in listed.splitlines() if e[0] in "ab" and e[2:5] != "0:0"]
            assert majors <= {"0", "1", "5", "136"}, listed


@pytest.fixture(scope="module")
def sandbox_unit(daemon: SystemdHarness) -> Iterator[str]:
    """A real session's sandbox unit (the demo agent), removed at the end."""
    proc = daemon.run(["ironctl", "session", "create", "--agent", "demo", "--json"], timeout=120)
    assert proc.returncode == 0, _out(proc)
    sid = str(json.loads(proc.stdout)["sid"])
    try:
        yield f"ironclaw-sbx-{sid}.service"
    finally:
        daemon.run(["ironctl", "session", "rm", "--force", sid])


@pytest.fixture(scope="module")
def scores(daemon: SystemdHarness, sandbox_unit: str) -> dict[str, dict[str, Any]]:
    found = {"daemon": analyze(daemon, DAEMON), "sandbox": analyze(daemon, sandbox_unit)}
    version = _out(daemon.run(["systemctl", "--version"])).splitlines()[0]
    keep = ("unit", "score", "verdict", "rows")
    report = {"systemd": version, **{k: {x: v[x] for x in keep} for k, v in found.items()}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "unit-security.json").write_text(json.dumps(report, indent=2) + "\n")
    for what in found.values():
        print(f"\n== systemd-analyze security {what['unit']}\n{what['text']}")
    return found


def test_both_exposure_scores_stay_at_most_what_was_reached(scores: dict[str, Any]) -> None:
    print(f"\nexposure: daemon {scores['daemon']['score']}, sandbox {scores['sandbox']['score']}")
    assert scores["daemon"]["score"] <= MAX_DAEMON_SCORE, scores["daemon"]["text"]
    assert scores["sandbox"]["score"] <= MAX_SANDBOX_SCORE, scores["sandbox"]["text"]


def test_the_sandbox_slice_caps_tasks_below_the_system_and_above_the_density_goal(
    daemon: SystemdHarness,
) -> None:
    # Every sandbox together may not take the host's last tasks, yet 500 idle sandboxes (issue
    # 17's density goal) at ~54 tasks each (runsc, gofer, sentry, ptrace stubs) must fit: the
    # fixed 16384 refused the 296th.
    # The limits as the managing systemd sees them: a private systemd in a PID namespace of
    # its own reads that namespace's pid_max (per namespace since Linux 6.14; 4194304 there
    # while the host's is 32768), not the test process's.
    p = show(daemon, "ironclaw.slice", "TasksMax")
    seen = daemon.run(["cat", "/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"])
    assert seen.returncode == 0, _out(seen)
    pid_max, threads_max = (int(v) for v in seen.stdout.split())
    assert p["TasksMax"].isdigit(), p  # a cap, not "infinity"
    assert int(p["TasksMax"]) < min(pid_max, threads_max), (p, pid_max, threads_max)
    assert int(p["TasksMax"]) >= 500 * 56, p


def test_daemon_settings_are_in_force(daemon: SystemdHarness, scores: dict[str, Any]) -> None:
    p = show(daemon, DAEMON, "CapabilityBoundingSet", "AmbientCapabilities", "NoNewPrivileges",
             "RestrictNamespaces", "RestrictAddressFamilies", "SystemCallArchitectures",
             "DevicePolicy", "MemoryDenyWriteExecute", "RestrictSUIDSGID", "ProtectClock",
             "ProtectHostname", "LockPersonality", "RestrictRealtime", "KeyringMode", "UMask",
             "MainPID", "LimitNOFILE", "LimitNOFILESoft", "TasksMax")  # fmt: skip
    assert set(p["CapabilityBoundingSet"].split()) == DAEMON_CAPS
    assert p["AmbientCapabilities"] == ""
    assert set(p["RestrictNamespaces"].split()) == {"net", "mnt"}
    assert set(p["RestrictAddressFamilies"].split()) == {
        "AF_UNIX", "AF_NETLINK", "AF_INET", "AF_INET6"
    }  # fmt: skip
    assert p["SystemCallArchitectures"] == "native"
    assert p["DevicePolicy"] == "closed"
    assert p["KeyringMode"] == "private"
    assert p["UMask"] == "0077"
    # 500 sessions at ~4 descriptors each, with room (issue 17); the default soft 1024 was not.
    assert int(p["LimitNOFILESoft"]) >= 16 * 1024, p
    assert int(p["LimitNOFILE"]) >= 16 * 1024, p
    assert p["TasksMax"].isdigit(), p  # a cap, not "infinity"
    assert int(p["TasksMax"]) >= 1024, p
    for flag in ("NoNewPrivileges", "MemoryDenyWriteExecute", "RestrictSUIDSGID", "ProtectClock",
                 "ProtectHostname", "LockPersonality", "RestrictRealtime"):  # fmt: skip
        assert p[flag] == "yes", flag
    proc = status(daemon, p["MainPID"])
    caps = int(proc["CapBnd"], 16)
    assert caps == sum(1 << n for n in (0, 1, 2, 3, 5, 9, 18, 21)), hex(caps)
    assert proc["NoNewPrivs"] == "1", proc
    assert proc["Seccomp"] == "2", proc
    assert_devices_closed(daemon, p["MainPID"])
    limits = _out(daemon.run(["cat", f"/proc/{p['MainPID']}/limits"]))
    (nofile,) = [ln.split()[3:5] for ln in limits.splitlines() if ln.startswith("Max open files")]
    # In force, not only configured (systemd clamps it to its own hard limit: 20000 here).
    assert int(nofile[0]) >= 16 * 1024, limits
    # No core file, whatever fs.suid_dumpable says: it would hold the master key (stop 47).
    (core,) = [ln.split()[4:6] for ln in limits.splitlines() if ln.startswith("Max core file")]
    assert core == ["0", "0"], limits


def test_sandbox_settings_are_in_force(
    daemon: SystemdHarness, sandbox_unit: str, scores: dict[str, Any]
) -> None:
    p = show(daemon, sandbox_unit, "ProtectSystem", "ProtectHome", "ReadWritePaths",
             "PrivateTmp", "PrivateDevices", "PrivateMounts", "PrivateNetwork",
             "NetworkNamespacePath", "NoNewPrivileges", "CapabilityBoundingSet",
             "RestrictNamespaces", "RestrictAddressFamilies", "IPAddressDeny", "DevicePolicy",
             "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
             "ProtectControlGroups", "ProtectClock", "ProtectHostname", "ProtectProc",
             "RestrictSUIDSGID", "SystemCallArchitectures", "MainPID",
             "InaccessiblePaths")  # fmt: skip
    sid = sandbox_unit.removeprefix("ironclaw-sbx-").removesuffix(".service")
    assert p["NetworkNamespacePath"] == f"/run/netns/ironclaw-{sid}"
    assert p["ProtectSystem"] == "strict"
    assert p["ProtectHome"] == "yes"
    assert p["ProtectProc"] == "invisible"
    assert p["DevicePolicy"] == "closed"
    # Writable: runsc's state, this session's outbound queue; nothing else of the host.
    assert p["ReadWritePaths"].split() == [
        "/run/ironclaw/runsc", f"/var/lib/ironclaw/queues/{sid}/outbound"
    ]  # fmt: skip
    assert p["InaccessiblePaths"] == "-/run/netns", p
    assert p["RestrictAddressFamilies"] == "AF_UNIX"
    assert set(p["RestrictNamespaces"].split()) == set(hardening.SANDBOX_NAMESPACES)
    assert set(p["IPAddressDeny"].split()) == {"0.0.0.0/0", "::/0"}
    assert p["SystemCallArchitectures"] == "native"
    for flag in ("PrivateTmp", "PrivateDevices", "PrivateMounts", "PrivateNetwork",
                 "NoNewPrivileges", "ProtectKernelTunables", "ProtectKernelModules",
                 "ProtectKernelLogs", "ProtectControlGroups", "ProtectClock", "ProtectHostname",
                 "RestrictSUIDSGID"):  # fmt: skip
        assert p[flag] == "yes", flag
    want = hardening.capability_mask(hardening.SANDBOX_CAPABILITIES)
    assert set(p["CapabilityBoundingSet"].split()) == {
        name.lower() for name in hardening.SANDBOX_CAPABILITIES
    }
    proc = status(daemon, p["MainPID"])
    assert int(proc["CapBnd"], 16) == want, proc["CapBnd"]
    assert proc["NoNewPrivs"] == "1", proc
    assert proc["Seccomp"] == "2", proc
    assert_devices_closed(daemon, p["MainPID"])


def test_a_running_session_keeps_no_netns_mount_and_its_unit_sees_no_other(
    daemon: SystemdHarness, sandbox_unit: str
) -> None:
    # A running session's netns is held by its unit's main process (runsc's parent) alone: no
    # name under /run/netns, so no nsfs mount on the host for any new unit to copy, and none
    # in a sandbox unit's mount namespace (another session's used to propagate into every
    # sandbox unit: O(N^2) mounts, and a view of the other sessions' netns).
    sid = sandbox_unit.removeprefix("ironclaw-sbx-").removesuffix(".service")
    pid = show(daemon, sandbox_unit, "MainPID")["MainPID"]
    proc = daemon.run(["ironctl", "session", "create", "--agent", "demo", "--json"], timeout=120)
    assert proc.returncode == 0, _out(proc)
    other = str(json.loads(proc.stdout)["sid"])
    try:
        other_pid = show(daemon, f"ironclaw-sbx-{other}.service", "MainPID")["MainPID"]
        mounts = _out(daemon.run(["cat", f"/proc/{pid}/mountinfo"]))
        assert mounts.strip(), pid
        assert " nsfs " not in mounts, [ln for ln in mounts.splitlines() if " nsfs " in ln]
        host = _out(daemon.run(["cat", "/proc/1/mountinfo"]))
        for name in (sid, other):
            assert f"/run/netns/ironclaw-{name}" not in host, name
        inodes = [
            _out(daemon.run(["stat", "-L", "-c", "%i", f"/proc/{p}/ns/net"])).strip()
            for p in (pid, other_pid, "1")
        ]
        assert all(inodes), inodes
        assert len(set(inodes)) == 3, inodes  # two sessions' own, neither the host's
        for p in (pid, other_pid):
            links = _out(daemon.run(["nsenter", f"--net=/proc/{p}/ns/net", "ip", "-o", "link"]))
            assert [ln.split(":")[1].strip() for ln in links.splitlines()] == ["lo"], links
    finally:
        daemon.run(["ironctl", "session", "rm", "--force", other], timeout=120)
