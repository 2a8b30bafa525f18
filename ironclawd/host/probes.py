"""Host checks for ``ironctl doctor``: systemd over D-Bus, runsc and its platforms, cgroups."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable
from pathlib import Path

from ironclawd.domain.checks import CheckResult, Status, failed, passed
from ironclawd.errors import HostError
from ironclawd.host.runsc import RunscInfo, detect, filesystem_flags
from ironclawd.ports import UnitManager, UnitSpec

RUNSC_TRY_TIMEOUT = 20.0


def probe_systemd() -> CheckResult:
    """Talk to PID 1 over the system bus, as the sandbox manager will."""
    name = "systemd.dbus"
    # Here, not at the top: pystemd is imported at its first use (host/systemd.py).
    from pystemd.systemd1 import Manager  # noqa: PLC0415

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


def probe_platform(
    units: UnitManager,
    runsc: Path,
    platform: str,
    *,
    detect_runsc: Callable[[Path], RunscInfo] = detect,
) -> CheckResult:
    """Run a trivial sandbox (``runsc do /bin/true``, no network) on one platform, in a transient
    unit hardened like a session's (host/hardening.py): the daemon's own unit lets runsc do too
    little, and a platform must work where the sandboxes will run."""
    name = f"runsc.platform.{platform}"
    unit = f"ironclaw-doctor-{platform}-{secrets.token_hex(4)}.service"
    try:
        # The sessions' file-access model (host/runsc.py): a platform must work with it.
        fs_flags = filesystem_flags(detect_runsc(runsc))
    except HostError as exc:
        return failed(name, str(exc), "apt-get install runsc", required=False)
    argv = [str(runsc), "--root=/tmp", "--network=none", f"--platform={platform}",
            "--ignore-cgroups", *fs_flags, "do", "/bin/true"]  # fmt: skip
    # inactive: a unit that succeeded is collected at once, one that failed stays with its result.
    spec = UnitSpec(unit, argv, f"IronClaw doctor: runsc on {platform}", None,
                    collect_mode="inactive")  # fmt: skip
    try:
        units.start_transient(spec, RUNSC_TRY_TIMEOUT)
        state = units.wait_inactive(unit, RUNSC_TRY_TIMEOUT)
    except HostError as exc:
        with contextlib.suppress(HostError):
            units.stop(unit, RUNSC_TRY_TIMEOUT)
        return failed(
            name, f"a trivial sandbox did not run: {exc}", _avoid(platform), required=False
        )
    finally:
        with contextlib.suppress(HostError):
            units.reset_failed(unit)
    if state is not None and state.result != "success":
        return failed(
            name,
            f"trivial sandbox failed ({state.result}; journalctl -u {unit})",
            _avoid(platform),
            required=False,
        )
    return passed(name, "a trivial sandbox ran in a hardened unit", required=False)


def _avoid(platform: str) -> str:
    return f"do not use sandbox.platform = '{platform}' on this host"


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
