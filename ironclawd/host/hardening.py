"""The walls systemd puts around a sandbox unit's runsc process tree (docs/threat-model.md).

gVisor is the wall the agent faces; these settings bound runsc itself (its parent, gofer and
sandbox processes run as host root or nobody with capabilities), so that a runsc bug or a gofer
confused by the box reaches as little of the host as runsc can work with. Each setting was
tried against runsc 0.0~20221219 on the ptrace platform; what runsc needs and therefore stays
open (user namespaces, mount, ptrace, setuid, chroot, ...) is justified in the threat model.
``systemd-analyze security`` scores the result (tests/integration/test_unit_hardening.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from ironclawd import paths

Property = tuple[str, str, Any]

# linux/capability.h
CAPABILITIES: Final[dict[str, int]] = {
    "CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_FOWNER": 3,
    "CAP_FSETID": 4, "CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SYS_CHROOT": 18,
    "CAP_SYS_ADMIN": 21,
}  # fmt: skip
# What `runsc run` needs as root, each found by taking it away (runsc 20221219, ptrace): the
# gofer keeps CHOWN, DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER, FSETID and SYS_CHROOT (0x4001f);
# runsc writes the oom_score_adj of its sandbox, a nobody process (DAC_OVERRIDE); SETUID and
# SETGID make the sandbox nobody; SYS_ADMIN makes the gofer's and sandbox's namespaces and
# mounts; KILL lets runsc's SIGTERM reach the nobody sandbox at stop. runsc ran without SETPCAP,
# SYS_PTRACE (its ptrace stubs are the sandbox's own children), SYS_RESOURCE and NET_ADMIN.
SANDBOX_CAPABILITIES: Final = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SYS_CHROOT", "CAP_SYS_ADMIN",
)  # fmt: skip
# sched.h: the namespaces runsc makes for its gofer and sandbox (no cgroup namespace: runsc
# runs with --ignore-cgroups). Each of the six is needed: runsc failed without any one.
CLONE_FLAGS: Final[dict[str, int]] = {
    "mnt": 0x00020000, "uts": 0x04000000, "ipc": 0x08000000, "user": 0x10000000,
    "pid": 0x20000000, "net": 0x40000000,
}  # fmt: skip
SANDBOX_NAMESPACES: Final = ("mnt", "uts", "ipc", "user", "pid", "net")
# Deny-listed syscall groups that runsc does not use (it does use mount, ptrace, setuid, chroot
# and rlimits: @mount, @debug, @privileged and @resources stay allowed).
SANDBOX_SYSCALL_DENY: Final = (
    "@clock", "@cpu-emulation", "@module", "@obsolete", "@raw-io", "@reboot", "@swap",
)  # fmt: skip
AF_INET: Final = 2
AF_INET6: Final = 10

# D-Bus signatures (systemd: src/core/dbus-execute.c, dbus-cgroup.c).
SIGNATURES: Final[dict[str, str]] = {
    "NoNewPrivileges": "b",
    "CapabilityBoundingSet": "t",
    "AmbientCapabilities": "t",
    "RestrictNamespaces": "t",
    "RestrictAddressFamilies": "(bas)",
    "SystemCallArchitectures": "as",
    "SystemCallFilter": "(bas)",
    "LockPersonality": "b",
    "RestrictRealtime": "b",
    "RestrictSUIDSGID": "b",
    "ProtectClock": "b",
    "ProtectHostname": "b",
    "ProtectKernelTunables": "b",
    "ProtectKernelModules": "b",
    "ProtectKernelLogs": "b",
    "ProtectControlGroups": "b",
    "ProtectSystem": "s",
    "ProtectHome": "s",
    "PrivateTmp": "b",
    "PrivateDevices": "b",
    "PrivateMounts": "b",
    "PrivateNetwork": "b",
    "ProtectProc": "s",
    "ReadWritePaths": "as",
    "InaccessiblePaths": "as",
    "DevicePolicy": "s",
    "IPAddressDeny": "a(iayu)",
    "KeyringMode": "s",
}


def capability_mask(names: Iterable[str]) -> int:
    """The bit mask of capability ``names`` (CAP_*)."""
    return sum(1 << CAPABILITIES[name] for name in set(names))


def namespace_mask(names: Iterable[str]) -> int:
    """The CLONE_NEW* mask of namespace ``names`` (mnt, uts, ipc, user, pid, net)."""
    return sum(CLONE_FLAGS[name] for name in set(names))


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def sandbox_properties(writable: Sequence[str], readonly: Sequence[str] = ()) -> list[Property]:
    """The hardening properties of a sandbox unit whose runsc must write only ``writable``
    (its state root, the session's outbound queue, read-write grants) and also reads
    ``readonly`` (read-only grants)."""
    # A grant below /home: ProtectHome=yes would hide it from runsc's gofer, which opens the
    # source in the unit's namespace (and systemd drops ReadWritePaths= below an inaccessible
    # directory); read-only shows it, and lets ReadWritePaths= reopen a writable one. A
    # read-only grant there made every start fail (found by a review).
    seen = (*writable, *readonly)
    home = "read-only" if any(_under(p, paths.HOME_DIRS) for p in seen) else "yes"
    return [
        ("NoNewPrivileges", "b", True),
        ("CapabilityBoundingSet", "t", capability_mask(SANDBOX_CAPABILITIES)),
        ("AmbientCapabilities", "t", 0),
        ("RestrictNamespaces", "t", namespace_mask(SANDBOX_NAMESPACES)),
        # runsc's processes talk over socketpairs and Unix sockets; with --network=none the
        # sandbox has its own netstack, so nothing here opens an Internet or netlink socket.
        ("RestrictAddressFamilies", "(bas)", (True, ["AF_UNIX"])),
        ("SystemCallArchitectures", "as", ["native"]),
        ("SystemCallFilter", "(bas)", (False, list(SANDBOX_SYSCALL_DENY))),
        ("LockPersonality", "b", True),
        ("RestrictRealtime", "b", True),
        # The gofer writes the box's files on the host disk: no setuid/setgid bit survives.
        ("RestrictSUIDSGID", "b", True),
        ("ProtectClock", "b", True),
        ("ProtectHostname", "b", True),
        ("ProtectKernelTunables", "b", True),
        ("ProtectKernelModules", "b", True),
        ("ProtectKernelLogs", "b", True),
        ("ProtectControlGroups", "b", True),
        ("ProtectSystem", "s", "strict"),
        ("ProtectHome", "s", home),
        ("ReadWritePaths", "as", sorted(set(writable))),
        # Every session's netns is a bind mount under the shared NETNS_DIR. Without this, each
        # one propagated into every running sandbox unit's mount namespace: the other
        # sessions' netns were visible to runsc's host side, and the system held O(N^2)
        # mounts, which slowed each new unit's namespace setup (77 ms at 10 sessions, 416 ms at
        # 300). systemd unmounts what is below an inaccessible path, and nothing propagates
        # there afterwards. It joins NetworkNamespacePath= before it builds this namespace.
        # Names exist only while sandboxes are being set up now (a running session releases
        # its own), but one being set up still must not be visible to the others.
        ("InaccessiblePaths", "as", [f"-{paths.NETNS_DIR}"]),
        ("PrivateTmp", "b", True),
        ("PrivateDevices", "b", True),
        ("PrivateMounts", "b", True),
        ("ProtectProc", "s", "invisible"),
        # Not set, because runsc fails with them: MemoryDenyWriteExecute= (the sandbox does not
        # start) and ProcSubset=pid (the sentry reads /proc/sys/vm/mmap_min_addr). Not set by
        # choice: UMask=0077 would strip group and other bits from every file the box writes
        # into a granted directory (the gofer creates them with its own umask).
        ("DevicePolicy", "s", "closed"),
        # Belt and braces around the empty netns: no IP packet from this cgroup, either way.
        ("IPAddressDeny", "a(iayu)", [(AF_INET, bytes(4), 0), (AF_INET6, bytes(16), 0)]),
        ("KeyringMode", "s", "private"),
    ]
