"""Filesystem and /proc attacks: writes where nothing may be written, host paths, mounts,
device nodes, link tricks in the writable dirs, and the session's own sockets, queue and key.

The paths of the session's own sockets, queue, key and agent binary are the daemon's layout
(ironclawd/bundle/spec.py; a unit test checks they agree): each attack on one of them checks
first that it is there (``target``), so that a target that moved is a probe error, not the
ENOENT of a refusal."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

from redteam_probe.probes.base import Attack, Opts, Refused, syscall, target

WORKSPACE = "/workspace"
SOCKETS = "/run/ironclaw"
CONTROL = f"{SOCKETS}/control.sock"
INBOUND = "/queue/inbound/inbound.db"
KEY = "/run/ironclaw-key"
AGENT = "/app/agent/agent"


def _sockets_dir() -> str:
    return target(SOCKETS, stat.S_ISDIR, "session's sockets directory")


def _control() -> str:
    return target(CONTROL, stat.S_ISSOCK, "session's control socket")


def _inbound() -> str:
    return target(INBOUND, stat.S_ISREG, "session's inbound queue")


def _key() -> str:
    return target(KEY, stat.S_ISREG, "session's queue key")


def _agent() -> str:
    return target(AGENT, stat.S_ISREG, "agent binary")


def _scratch(name: str) -> str:
    path = os.path.join(WORKSPACE, f".rt-{name}-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        os.unlink(path)
    return path


def _create(path: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    os.close(fd)
    os.unlink(path)
    return f"created {path}"


def _open_write(path: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    os.close(fd)
    return f"opened {path} for writing"


def _write(path: str, data: bytes) -> str:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return f"wrote {len(data)} bytes to {path}"


def _read(path: str) -> str:
    with open(path, "rb") as handle:
        data = handle.read(200)
    return f"read {path}: {data[:80]!r}"


def root_write(_opts: Opts) -> str:
    return _create("/.rt-root-write")


def app_write(_opts: Opts) -> str:
    return _open_write(_agent())


def etc_write(_opts: Opts) -> str:
    return _create("/etc/.rt-etc-write")


def tmp_write(_opts: Opts) -> str:
    return _create("/tmp/.rt-tmp-write")


def host_marker(opts: Opts) -> str:
    """A file the test placed on the host: nothing of the host's /etc is in the box."""
    return _read(opts.get("host_marker", "/etc/ironclaw-redteam-marker"))


def host_shadow(_opts: Opts) -> str:
    return _read("/etc/shadow")


def proc1_root(_opts: Opts) -> str:
    """/proc/1 is the box's own init (the agent), and its root the box's root."""
    target = os.readlink("/proc/1/root")
    cmdline = Path("/proc/1/cmdline").read_bytes().split(b"\0")[0]
    if cmdline.endswith(b"agent") and not os.path.exists("/proc/1/root/var/lib/ironclaw"):
        raise Refused(f"/proc/1 is the agent ({cmdline!r}), its root {target!r} is the box's")
    return f"/proc/1 is {cmdline!r}, root {target!r}"


def proc1_environ_host(_opts: Opts) -> str:
    data = Path("/proc/1/environ").read_bytes()
    if b"INVOCATION_ID=" in data or b"NOTIFY_SOCKET=" in data:
        return "host service environment visible"
    raise Refused("no host service variables in /proc/1/environ")


def proc_sys_write(_opts: Opts) -> str:
    return _write("/proc/sys/kernel/core_pattern", b"|/workspace/x")


def proc_sys_hostname(_opts: Opts) -> str:
    return _write("/proc/sys/kernel/hostname", b"pwned")


def proc_sysrq(_opts: Opts) -> str:
    return _write("/proc/sysrq-trigger", b"h")


def sys_write(_opts: Opts) -> str:
    for path in ("/sys/kernel/uevent_helper", "/sys/kernel/mm/transparent_hugepage/enabled",
                 "/sys/fs/cgroup/cgroup.procs"):  # fmt: skip
        with contextlib.suppress(FileNotFoundError):
            return _write(path, b"0")
    raise Refused("no writable /sys knob exists")


def _mount(source: bytes, target: bytes, fstype: bytes, flags: int = 0) -> str:
    syscall("mount", source, target, fstype, flags, None)
    return f"mounted {fstype!r} on {target!r}"


def mount_tmpfs(_opts: Opts) -> str:
    target = _scratch("mnt")
    os.mkdir(target)
    try:
        return _mount(b"none", target.encode(), b"tmpfs")
    finally:
        with contextlib.suppress(OSError):
            syscall("umount2", target.encode(), 2)
        os.rmdir(target)


def remount_root_rw(_opts: Opts) -> str:
    return _mount(b"none", b"/", b"", 0x20 | 0x1000)  # MS_REMOUNT | MS_BIND, no MS_RDONLY


def bind_proc_over_workspace(_opts: Opts) -> str:
    return _mount(b"/proc", WORKSPACE.encode(), b"", 0x1000)


def umount_workspace(_opts: Opts) -> str:
    syscall("umount2", WORKSPACE.encode(), 2)  # MNT_DETACH
    return "unmounted /workspace"


def umount_sockets(_opts: Opts) -> str:
    syscall("umount2", _sockets_dir().encode(), 2)
    return f"unmounted {SOCKETS}"


def pivot_root(_opts: Opts) -> str:
    syscall("pivot_root", WORKSPACE.encode(), WORKSPACE.encode())
    return "pivot_root done"


def chroot(_opts: Opts) -> str:
    syscall("chroot", WORKSPACE.encode())
    return "chroot done"


def mknod_char(_opts: Opts) -> str:
    """A /dev/mem node (char 1:1) in the workspace, then open it."""
    path = _scratch("mem")
    syscall("mknod", path.encode(), 0o20600, os.makedev(1, 1))
    try:
        return _read(path)
    finally:
        os.unlink(path)


def mknod_block(_opts: Opts) -> str:
    path = _scratch("sda")
    syscall("mknod", path.encode(), 0o60600, os.makedev(8, 0))
    try:
        return _read(path)
    finally:
        os.unlink(path)


def symlink_host(_opts: Opts) -> str:
    """A link in the workspace to a host path resolves inside the box, where it is not."""
    path = _scratch("link")
    os.symlink("/proc/self/root/../../../../var/lib/ironclaw/state.db", path)
    try:
        return _read(path)
    finally:
        os.unlink(path)


def symlink_in_outbound(_opts: Opts) -> str:
    """A link planted where the host reads: the read-only sockets dir refuses it."""
    os.symlink("/etc/shadow", f"{_sockets_dir()}/outbound.db")
    return "planted a link in the sockets dir"


def hardlink_readonly(_opts: Opts) -> str:
    """Hard-linking a read-only file into the writable workspace (to write it there)."""
    agent = _agent()
    path = _scratch("hard")
    os.link(agent, path)
    os.unlink(path)
    return "linked the agent binary into the workspace"


def hardlink_key(_opts: Opts) -> str:
    key = _key()
    path = _scratch("key")
    os.link(key, path)
    os.unlink(path)
    return "linked the session key into the workspace"


def socket_create(_opts: Opts) -> str:
    directory = _sockets_dir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(f"{directory}/evil.sock")
    return "bound a socket in the sockets dir"


def socket_replace(_opts: Opts) -> str:
    """Bind a socket in the workspace and rename it over control.sock."""
    control = _control()
    path = _scratch("sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(path)
        try:
            os.rename(path, control)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return "replaced control.sock"


def socket_unlink(_opts: Opts) -> str:
    os.unlink(_control())
    return "unlinked control.sock"


def inbound_write(_opts: Opts) -> str:
    return _open_write(_inbound())


def inbound_replace(_opts: Opts) -> str:
    inbound = _inbound()
    os.rename(inbound, os.path.join(os.path.dirname(inbound), "x"))
    return "renamed inbound.db"


def key_write(_opts: Opts) -> str:
    return _open_write(_key())


def key_chmod(_opts: Opts) -> str:
    os.chmod(_key(), 0o666)  # noqa: S103 - the attack
    return "chmod 666 the key"


def dev_nodes(_opts: Opts) -> str:
    """Devices that reach hardware or the host kernel (gVisor serves its own null, zero, tty,
    fuse, net/tun...)."""
    for name in ("mem", "kmem", "port", "kmsg", "kvm", "sda", "vda", "nvme0", "loop0", "dri",
                 "vhost-net", "vsock", "cpu/0/msr", "hpet", "nvram"):  # fmt: skip
        with contextlib.suppress(OSError):
            os.close(os.open(f"/dev/{name}", os.O_RDONLY))
            return f"opened /dev/{name}"
    raise Refused(f"no hardware or host-kernel device; /dev holds {sorted(os.listdir('/dev'))}")


ATTACKS: dict[str, Attack] = {
    "fs.root.write": root_write,
    "fs.root.overwrite-agent": app_write,
    "fs.etc.write": etc_write,
    "fs.tmp.write": tmp_write,
    "fs.host.marker-read": host_marker,
    "fs.host.shadow-read": host_shadow,
    "fs.proc.pid1-root": proc1_root,
    "fs.proc.pid1-environ": proc1_environ_host,
    "fs.proc.sys-core-pattern": proc_sys_write,
    "fs.proc.sys-hostname": proc_sys_hostname,
    "fs.proc.sysrq-trigger": proc_sysrq,
    "fs.sys.write": sys_write,
    "fs.mount.tmpfs": mount_tmpfs,
    "fs.mount.remount-root-rw": remount_root_rw,
    "fs.mount.bind-proc": bind_proc_over_workspace,
    "fs.umount.workspace": umount_workspace,
    "fs.umount.sockets": umount_sockets,
    "fs.pivot-root": pivot_root,
    "fs.chroot": chroot,
    "fs.mknod.char-mem": mknod_char,
    "fs.mknod.block-disk": mknod_block,
    "fs.symlink.host-state": symlink_host,
    "fs.symlink.sockets-dir": symlink_in_outbound,
    "fs.hardlink.agent-binary": hardlink_readonly,
    "fs.hardlink.session-key": hardlink_key,
    "fs.sockets.create": socket_create,
    "fs.sockets.replace": socket_replace,
    "fs.sockets.unlink": socket_unlink,
    "fs.inbound.write": inbound_write,
    "fs.inbound.rename": inbound_replace,
    "fs.key.write": key_write,
    "fs.key.chmod": key_chmod,
    "fs.dev.nodes": dev_nodes,
}
