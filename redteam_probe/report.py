"""The probe's report: the sandbox as the agent sees it from inside, plus the attempts asked for.

Passive facts (identity, privileges, network, filesystem, kernel, processes) and the single
attempts of ``redteam_probe.attacks`` (connects, a look at a path, a raw gRPC call, a grep of
every readable file). The tests decide what must hold; this module only reports.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from redteam_probe import attacks
from redteam_probe.probes.grep import grep_tree

JSON = dict[str, object]

# prctl(2): PR_GET_NO_NEW_PRIVS. gVisor (runsc 20221219) leaves NoNewPrivs and CapAmb out of
# /proc/self/status, so ask the kernel directly as well.
PR_GET_NO_NEW_PRIVS = 39

STATUS_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")
_CAP_FIELDS = frozenset({"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"})


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _parse_status(text: str | None) -> JSON:
    """Pick the privilege fields out of /proc/self/status (proc(5)); capability masks as ints."""
    found: JSON = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_FIELDS:
            value = value.strip()
            found[key] = int(value, 16) if key in _CAP_FIELDS else int(value)
    return found


def _net_dev_interfaces(text: str | None) -> list[str] | None:
    """Interface names from /proc/net/dev: two header lines, then ``name: counters``."""
    if text is None:
        return None
    return sorted(line.split(":", 1)[0].strip() for line in text.splitlines()[2:] if ":" in line)


def _sys_class_net() -> list[str] | None:
    try:
        return sorted(os.listdir("/sys/class/net"))
    except OSError:
        return None


def _routes(text: str | None) -> list[str] | None:
    """Route lines of /proc/net/route, header dropped; empty means no IPv4 route at all."""
    if text is None:
        return None
    return [line.strip() for line in text.splitlines()[1:] if line.strip()]


def _routes6(text: str | None) -> list[str] | None:
    """Lines of /proc/net/ipv6_route (no header); None if the file is absent."""
    if text is None:
        return None
    return [line.strip() for line in text.splitlines() if line.strip()]


def _is_writable(directory: str) -> JSON:
    """Try to create (and remove) a file in ``directory``; report errno rather than guess."""
    probe = os.path.join(directory, f".ironclaw-probe-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        return {"writable": False, "errno": errno.errorcode.get(exc.errno or 0, str(exc.errno))}
    os.close(fd)
    os.unlink(probe)
    return {"writable": True, "errno": None}


def _prctl_no_new_privs() -> int | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        value = int(libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0))
    except (OSError, AttributeError):
        return None
    return None if value < 0 else value


def _list_dir(path: str) -> list[str] | None:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None


# Where an attacker would look for a place to write; "/" stays in the report as "root" too.
WRITABLE_CANDIDATES = (
    "/", "/tmp", "/workspace", "/run", "/run/ironclaw", "/etc", "/app", "/lib", "/dev", "/dev/shm",
    "/sys", "/proc",
)  # fmt: skip


def _processes(pids: list[int] | None) -> list[JSON]:
    """Each visible process: pid, argv[0] and the IRONCLAW_SID in its environment, if readable."""
    found: list[JSON] = []
    for pid in pids or []:
        cmdline = _read_bytes(f"/proc/{pid}/cmdline")
        environ = _read_bytes(f"/proc/{pid}/environ")
        sid = None
        for item in (environ or b"").split(b"\0"):
            if item.startswith(b"IRONCLAW_SID="):
                sid = item.partition(b"=")[2].decode("utf-8", "replace")
        argv0 = (cmdline or b"").split(b"\0", 1)[0].decode("utf-8", "replace")
        found.append(
            {"pid": pid, "argv0": argv0, "sid": sid, "environ_readable": environ is not None}
        )
    return found


def _read_bytes(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except OSError:
        return None


def _proc_pids() -> list[int] | None:
    try:
        return sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
    except OSError:
        return None


def probe(
    *,
    net_targets: Sequence[str] = (),
    unix_paths: Sequence[str] = (),
    look_paths: Sequence[str] = (),
    grep_needles: Sequence[bytes] = (),
    grpc_calls: Sequence[str] = (),
) -> JSON:
    """What the agent sees of its sandbox: identity, privileges, network, filesystem, kernel;
    plus the attempts asked for: IP connects to ``net_targets`` (TCP and UDP), Unix connects to
    ``unix_paths``, a look at each of ``look_paths``, and (if any ``grep_needles``) every
    readable file searched for them."""
    report = _passive_report()
    if grep_needles:
        report["grep"] = grep_tree(grep_needles)
    report.update(
        {
            "net": [
                attacks.try_connect_ip(target, kind)
                for target in net_targets
                for kind in ("tcp", "udp")
            ],
            "unix": [attacks.try_connect_unix(path) for path in unix_paths],
            "paths": {path: attacks.look_at(path) for path in look_paths},
            "grpc": [attacks.try_grpc_call(target) for target in grpc_calls],
        }
    )
    return report


def _passive_report() -> JSON:
    uname = os.uname()
    mounts = _read_text("/proc/self/mounts")
    return {
        "pid": os.getpid(),
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "gid": os.getgid(),
        "egid": os.getegid(),
        "groups": os.getgroups(),
        "status": _parse_status(_read_text("/proc/self/status")),
        "no_new_privs": _prctl_no_new_privs(),
        "net_dev_interfaces": _net_dev_interfaces(_read_text("/proc/net/dev")),
        "sys_class_net": _sys_class_net(),
        "routes": _routes(_read_text("/proc/net/route")),
        "root": _is_writable("/"),
        "uname": {
            "sysname": uname.sysname,
            "release": uname.release,
            "version": uname.version,
            "machine": uname.machine,
        },
        "proc_version": (_read_text("/proc/version") or "").strip() or None,
        "resolv_conf_exists": os.path.lexists("/etc/resolv.conf"),
        "top_level": _list_dir("/"),
        "mounts": None if mounts is None else mounts.splitlines(),
        "executable": sys.executable,
        "frozen": bool(getattr(sys, "frozen", False)),
        "ipv6_routes": _routes6(_read_text("/proc/net/ipv6_route")),
        "hostname": uname.nodename,
        "proc_pids": _proc_pids(),
        "processes": _processes(_proc_pids()),
        "kernel_log": attacks.read_kernel_log(),
        "run_ironclaw": _list_dir("/run/ironclaw"),
        "writable": {path: _is_writable(path) for path in WRITABLE_CANDIDATES},
        "workspace_exec": attacks.try_exec_in("/workspace"),
    }
