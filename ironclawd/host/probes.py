"""Host checks for ``ironctl doctor``: systemd over D-Bus, runsc and its platforms, cgroups."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from pystemd.systemd1 import Manager

from ironclawd.domain.checks import CheckResult, Status, failed, passed
from ironclawd.errors import HostError
from ironclawd.host.runsc import RunscInfo, detect

RUNSC_TRY_TIMEOUT = 20.0


def probe_systemd() -> CheckResult:
    """Talk to PID 1 over the system bus, as the sandbox manager will."""
    name = "systemd.dbus"
    try:
        with Manager() as manager:
            version = manager.Manager.Version.decode()
            state = manager.Manager.SystemState.decode()
    except Exception as exc:  # pystemd raises bare DBus errors of several kinds
        return failed(
            name,
            f"cannot reach systemd over D-Bus: {exc}",
            "ironclawd needs systemd as PID 1 and dbus running (apt-get install dbus)",
        )
    detail = f"systemd {version}, system state {state}"
    if state not in ("running", "degraded"):
        return CheckResult(name, Status.WARN, detail, "wait for boot to finish", required=True)
    return passed(name, detail)


def probe_runsc(runsc: Path) -> tuple[CheckResult, RunscInfo | None]:
    """Is runsc there, which version, which flags and platforms (host/runsc.py's detection)."""
    name = "runsc.version"
    try:
        info = detect(runsc)
    except HostError as exc:
        return failed(name, str(exc), "apt-get install runsc"), None
    missing = [f for f in ("host-uds", "ignore-cgroups") if f not in info.flags]
    if missing:
        return failed(
            name,
            f"{runsc} {info.version} lacks --{', --'.join(missing)}",
            "install a runsc from 2022 or later (Debian 12's works)",
        ), info
    return passed(name, f"{runsc} {info.version}"), info


def probe_platform(runsc: Path, platform: str) -> CheckResult:
    """Run a trivial sandbox (``runsc do /bin/true``, no network) on one platform."""
    name = f"runsc.platform.{platform}"
    with tempfile.TemporaryDirectory(prefix="ironclaw-doctor-") as root:
        argv = [str(runsc), f"--root={root}", "--network=none", f"--platform={platform}"]
        try:
            proc = subprocess.run(
                [*argv, "do", "/bin/true"],
                capture_output=True,
                text=True,
                timeout=RUNSC_TRY_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return failed(
                name,
                f"a trivial sandbox did not finish in {RUNSC_TRY_TIMEOUT:g}s",
                f"do not use sandbox.platform = '{platform}' on this host",
                required=False,
            )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return failed(
            name,
            f"trivial sandbox failed (exit {proc.returncode}): {last}",
            f"do not use sandbox.platform = '{platform}' on this host",
            required=False,
        )
    return passed(name, "a trivial sandbox ran", required=False)


def probe_cgroups() -> CheckResult:
    """Report the cgroup layout and whether memory and pids limits can bind."""
    name = "cgroup.layout"
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    types = {fields[1]: fields[2] for line in mounts if len(fields := line.split()) > 2}
    root_type = types.get("/sys/fs/cgroup", "absent")
    if root_type == "cgroup2":
        layout = "unified (cgroup v2)"
        controllers = Path("/sys/fs/cgroup/cgroup.controllers").read_text().split()
    elif root_type == "tmpfs":
        layout = "hybrid" if "/sys/fs/cgroup/unified" in types else "legacy (cgroup v1)"
        controllers = [p.rsplit("/", 1)[-1] for p, t in types.items() if t == "cgroup"]
        controllers = [c for part in controllers for c in part.split(",")]
    else:
        return failed(name, "no cgroup filesystem at /sys/fs/cgroup", "mount cgroup2")
    missing = [c for c in ("memory", "pids", "cpu") if c not in controllers]
    detail = f"{layout}; controllers: {', '.join(sorted(set(controllers))) or 'none'}"
    if missing:
        return failed(
            name,
            f"{detail}; missing {', '.join(missing)}",
            "enable the controllers (systemd.unified_cgroup_hierarchy=1 on the kernel line)",
        )
    return passed(name, detail)
