"""Privilege and kernel-surface attacks: credentials, capabilities, namespaces, tracing, and
the system calls that reach deep into a kernel (bpf, perf, keys, userfaultfd, io_uring,
modules). gVisor's sentry answers them; nothing here may reach the host's kernel or processes.
"""

from __future__ import annotations

import ctypes
import os

from redteam_probe.probes.base import Attack, Opts, Refused, in_child, syscall

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000


def setuid0(_opts: Opts) -> str:
    def child() -> str:
        os.setuid(0)
        return f"uid {os.getuid()}"

    return str(in_child(child))


def setresuid0(_opts: Opts) -> str:
    def child() -> str:
        syscall("setresuid", 0, 0, 0)
        return f"uid {os.getresuid()}"

    return str(in_child(child))


def setgid0(_opts: Opts) -> str:
    def child() -> str:
        os.setgid(0)
        return f"gid {os.getgid()}"

    return str(in_child(child))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]  # fmt: skip


def capset_all(_opts: Opts) -> str:
    def child() -> str:
        header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
        data = (_CapData * 2)(_CapData(0xFFFFFFFF, 0xFFFFFFFF, 0), _CapData(0x3F, 0x3F, 0))
        syscall("capset", ctypes.byref(header), ctypes.byref(data))
        return "raised every capability"

    return str(in_child(child))


def _unshare(flags: int, then: str) -> object:
    def child() -> object:
        syscall("unshare", flags)
        done = [f"unshare({flags:#x})"]
        if then == "mount-proc":
            # What an attacker wants a new mount namespace for: a mount the box did not have.
            syscall("mount", b"none", b"/workspace", b"tmpfs", 0, None)
            done.append("mounted tmpfs")
        elif then == "host":
            # With "root" in its own user namespace: reach for the host. Nothing of it is here.
            for path in ("/var/lib/ironclaw", "/run/ironclaw/admin.sock", "/etc/shadow"):
                if os.path.exists(path):
                    done.append(f"sees {path}")
                    return done
            raise Refused(f"{done[0]} worked (gVisor's own user namespace) but no host path")
        elif then == "net":
            names = sorted(os.listdir("/sys/class/net"))
            if names in ([], ["lo"]):
                raise Refused(f"new network namespace holds only {names}")
            done.append(f"interfaces {names}")
        return done

    return in_child(child)


def unshare_user(_opts: Opts) -> object:
    return _unshare(CLONE_NEWUSER, "host")


def unshare_mount(_opts: Opts) -> object:
    return _unshare(CLONE_NEWNS, "mount-proc")


def unshare_net(_opts: Opts) -> object:
    return _unshare(CLONE_NEWNET, "net")


def unshare_user_net(_opts: Opts) -> object:
    return _unshare(CLONE_NEWUSER | CLONE_NEWNET, "net")


def setns_host(opts: Opts) -> str:
    """Open a network namespace the box does not own: none is visible, /proc/1 is the agent."""
    pid = opts.get("host_pid", "1")
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        syscall("setns", fd, CLONE_NEWNET)
    finally:
        os.close(fd)
    return f"joined /proc/{pid}/ns/net"


def ptrace_outside(opts: Opts) -> str:
    """PTRACE_ATTACH to a host pid (the daemon's, named by the test)."""
    syscall("ptrace", 16, int(opts.get("host_pid", "1")), 0, 0)
    return "attached"


def ptrace_pid1(_opts: Opts) -> str:
    """PTRACE_ATTACH to the agent (pid 1 of the box): same uid, but init is not traceable."""

    def child() -> str:
        syscall("ptrace", 16, 1, 0, 0)
        return "attached to pid 1"

    return str(in_child(child))


def process_vm_read(opts: Opts) -> str:
    buf = ctypes.create_string_buffer(16)
    local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), ctypes.c_void_p(16))
    remote = (ctypes.c_void_p * 2)(ctypes.c_void_p(0x400000), ctypes.c_void_p(16))
    syscall("process_vm_readv", int(opts.get("host_pid", "1")), local, 1, remote, 1, 0)
    return "read host process memory"


def bpf(_opts: Opts) -> str:
    attr = ctypes.create_string_buffer(128)  # BPF_MAP_CREATE of a zeroed (invalid) map
    syscall("bpf", 0, attr, 128)
    return "bpf() answered"


def bpf_prog(_opts: Opts) -> str:
    insns = (ctypes.c_uint64 * 2)(0x00000000000000B7, 0x0000000000000095)  # r0 = 0; exit
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = (ctypes.c_uint32 * 32)()
    attr[0] = 1  # BPF_PROG_TYPE_SOCKET_FILTER
    attr[1] = 2
    ctypes.memmove(ctypes.byref(attr, 8), ctypes.byref(ctypes.c_uint64(ctypes.addressof(insns))), 8)
    addr = ctypes.c_uint64(ctypes.addressof(license_))
    ctypes.memmove(ctypes.byref(attr, 16), ctypes.byref(addr), 8)
    syscall("bpf", 5, ctypes.byref(attr), ctypes.sizeof(attr))  # BPF_PROG_LOAD
    return "loaded a bpf program"


def perf_event_open(_opts: Opts) -> str:
    attr = (ctypes.c_uint8 * 128)()
    attr[4] = 128  # size (u32 at offset 4); type 0 (hardware), config 0 (cycles)
    fd = syscall("perf_event_open", ctypes.byref(attr), -1, 0, -1, 0)  # every process, cpu 0
    os.close(fd)
    return "opened a system-wide perf event"


def keyctl(_opts: Opts) -> str:
    serial = syscall("add_key", b"user", b"rt", b"x", 1, -3)  # KEY_SPEC_SESSION_KEYRING
    return f"added key {serial}"


def keyctl_read(_opts: Opts) -> str:
    buf = ctypes.create_string_buffer(4096)
    syscall("keyctl", 11, -4, buf, 4096)  # KEYCTL_READ of the user keyring
    return "read the user keyring"


def userfaultfd(_opts: Opts) -> str:
    fd = syscall("userfaultfd", os.O_CLOEXEC)
    os.close(fd)
    return "userfaultfd opened"


def io_uring(_opts: Opts) -> str:
    params = (ctypes.c_uint8 * 120)()
    fd = syscall("io_uring_setup", 4, ctypes.byref(params))
    os.close(fd)
    return "io_uring set up"


def init_module(_opts: Opts) -> str:
    image = ctypes.create_string_buffer(b"\x7fELF" + b"\0" * 60)
    syscall("init_module", image, 64, b"")
    return "init_module accepted"


def finit_module(_opts: Opts) -> str:
    fd = os.open("/app/agent/agent", os.O_RDONLY)
    try:
        syscall("finit_module", fd, b"", 0)
    finally:
        os.close(fd)
    return "finit_module accepted"


def delete_module(_opts: Opts) -> str:
    syscall("delete_module", b"overlay", 0o4000)  # O_NONBLOCK
    return "removed a module"


def kexec(_opts: Opts) -> str:
    syscall("kexec_load", 0, 0, 0, 0)
    return "kexec_load accepted"


def reboot(_opts: Opts) -> str:
    syscall("reboot", 0xFEE1DEAD, 0x28121969, 0, 0)  # RB_ENABLE_CAD: harmless if it worked
    return "reboot(2) accepted"


def personality(_opts: Opts) -> str:
    """READ_IMPLIES_EXEC would make every readable mapping executable (noexec's workaround)."""

    def child() -> str:
        syscall("personality", 0x0400000)
        now = syscall("personality", 0xFFFFFFFF)
        if not now & 0x0400000:
            raise Refused(f"personality stayed {now:#x}")
        return f"personality {now:#x}"

    return str(in_child(child))


def iopl(_opts: Opts) -> str:
    syscall("iopl", 3)
    return "iopl(3) granted"


def sethostname(_opts: Opts) -> str:
    syscall("sethostname", b"pwned", 5)
    return "hostname set"


def settime(_opts: Opts) -> str:
    tv = (ctypes.c_long * 2)(0, 0)
    syscall("settimeofday", ctypes.byref(tv), None)
    return "clock set to 1970"


def open_by_handle(_opts: Opts) -> str:
    """The "shocker" escape: open a host inode by handle (needs CAP_DAC_READ_SEARCH)."""
    handle = (ctypes.c_uint8 * 16)()
    handle[0], handle[4], handle[8] = 8, 1, 2  # 8 bytes, type 1, inode 2: a filesystem's root
    fd = os.open("/", os.O_RDONLY)
    try:
        syscall("open_by_handle_at", fd, ctypes.byref(handle), 0)
    finally:
        os.close(fd)
    return "opened an inode by handle"


def syslog_clear(_opts: Opts) -> str:
    syscall("syslog", 5, None, 0)  # SYSLOG_ACTION_CLEAR
    return "kernel log cleared"


def acct(_opts: Opts) -> str:
    syscall("acct", b"/workspace/acct")
    return "process accounting switched on"


def swapon(_opts: Opts) -> str:
    syscall("swapon", b"/workspace/swap", 0)
    return "swapon accepted"


def caps_held(_opts: Opts) -> str:
    """capget(2) of this process: effective and permitted sets (both 32-bit halves)."""
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    syscall("capget", ctypes.byref(header), ctypes.byref(data))
    held = {
        "effective": data[0].effective | data[1].effective << 32,
        "permitted": data[0].permitted | data[1].permitted << 32,
    }
    if not any(held.values()):
        raise Refused(f"no capabilities: {held}")
    return f"capabilities held: { {k: hex(v) for k, v in held.items()} }"


ATTACKS: dict[str, Attack] = {
    "priv.setuid-0": setuid0,
    "priv.setresuid-0": setresuid0,
    "priv.setgid-0": setgid0,
    "priv.capset-all": capset_all,
    "priv.capabilities-held": caps_held,
    "priv.unshare-user": unshare_user,
    "priv.unshare-mount": unshare_mount,
    "priv.unshare-net": unshare_net,
    "priv.unshare-user-net": unshare_user_net,
    "priv.setns-host-net": setns_host,
    "kernel.ptrace.host-pid": ptrace_outside,
    "kernel.ptrace.pid1": ptrace_pid1,
    "kernel.process-vm-readv.host-pid": process_vm_read,
    "kernel.bpf.map-create": bpf,
    "kernel.bpf.prog-load": bpf_prog,
    "kernel.perf-event-open": perf_event_open,
    "kernel.keyctl.add-key": keyctl,
    "kernel.keyctl.read-user-keyring": keyctl_read,
    "kernel.userfaultfd": userfaultfd,
    "kernel.io-uring-setup": io_uring,
    "kernel.module.init": init_module,
    "kernel.module.finit": finit_module,
    "kernel.module.delete": delete_module,
    "kernel.kexec-load": kexec,
    "kernel.reboot": reboot,
    "kernel.personality.read-implies-exec": personality,
    "kernel.iopl": iopl,
    "kernel.sethostname": sethostname,
    "kernel.settimeofday": settime,
    "kernel.open-by-handle-at": open_by_handle,
    "kernel.syslog-clear": syslog_clear,
    "kernel.acct": acct,
    "kernel.swapon": swapon,
}
