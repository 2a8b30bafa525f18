"""Attacks from inside a real session, as its agent's uid: network, filesystem and /proc,
privileges and the kernel surface (redteam_probe/probes/{net,fs,kernel}.py, one ``runsc exec`` per
category). Each attack is recorded in the containment report and asserts both the contained
outcome inside and an unchanged host: what it aimed at is snapshotted before and after.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.harness.pool import pooled_daemon
from tests.harness.private_systemd import SystemdHarness
from tests.redteam.conftest import (
    RUNNING,
    SANDBOX_KINDS,
    HostListener,
    Sandbox,
    module_sessions,
    open_listener,
    out,
    record,
    sh,
)
from tests.redteam.report import Ledger

pytestmark = pytest.mark.redteam

MARKER = f"/etc/ironclaw-redteam-{secrets.token_hex(6)}"
Raw = dict[str, Any]


def failed(*errnos: str) -> Callable[[Raw], bool]:
    """The attempt failed, with one of ``errnos`` if any are named."""
    return lambda r: r["ok"] is False and (not errnos or r["errno"] in errnos)


def refused(r: Raw) -> bool:
    """Failed, whatever the errno (or no errno: the probe saw nothing to use)."""
    return r["ok"] is False


NO_ROUTE = failed("ENETUNREACH", "EHOSTUNREACH")
_REFUSALS = ("EPERM", "EACCES", "EROFS", "ENOSYS", "EXDEV", "ENXIO", "ENOTSUP", "EINVAL",
             "ENODEV", "ESRCH")  # fmt: skip
DENIED = failed(*_REFUSALS, "ENOENT")
# For the session's own sockets, queue, key and the agent binary: the probe checks first that
# the target is there (a missing one is a probe error), so ENOENT here is no refusal either.
DENIED_THERE = failed(*_REFUSALS)


@dataclass(frozen=True)
class Spec:
    category: str
    title: str
    inside: Callable[[Raw], bool]
    aims: tuple[str, ...] = ()  # host facts that must be unchanged afterwards


def _n(title: str, inside: Callable[[Raw], bool], *aims: str) -> Spec:
    return Spec("network", title, inside, ("netns", *aims))


def _f(title: str, inside: Callable[[Raw], bool], *aims: str, category: str = "filesystem") -> Spec:
    return Spec(category, title, inside, ("rootfs", "mounts", *aims))


def _k(title: str, inside: Callable[[Raw], bool], *aims: str, category: str = "kernel") -> Spec:
    return Spec(category, title, inside, aims)


SPECS: dict[str, Spec] = {
    "net.tcp.host-loopback": _n("TCP connect to a listener on the host's 127.0.0.1",
                                failed("ECONNREFUSED"), "listener"),
    "net.udp.host-loopback": _n("UDP datagram to a listener on the host's 127.0.0.1",
                                lambda r: True, "listener"),
    "net.tcp6.host-loopback": _n("TCP connect to the host's ::1", failed("ECONNREFUSED")),
    "net.tcp.v4-out": _n("TCP connect out (198.51.100.1)", NO_ROUTE),
    "net.udp.v4-out": _n("UDP send out (198.51.100.1)", NO_ROUTE),
    "net.tcp.v6-out": _n("TCP connect out over IPv6 (2001:db8::1)", NO_ROUTE),
    "net.udp.v6-out": _n("UDP send out over IPv6 (2001:db8::1)", NO_ROUTE),
    "net.icmp.echo-out": _n("ICMP echo out through a ping socket", NO_ROUTE),
    "net.raw.ipv4": _n("open a raw IPv4 socket", failed("EPERM", "EACCES")),
    "net.raw.ipv6": _n("open a raw IPv6 socket", failed("EPERM", "EACCES")),
    "net.packet.socket": _n("open an AF_PACKET socket", failed("EPERM", "EACCES",
                                                               "EAFNOSUPPORT")),
    "net.netlink.route-add": _n("netlink RTM_NEWROUTE: a default route", DENIED),
    "net.netlink.addr-add": _n("netlink RTM_NEWADDR: an address on lo", DENIED),
    "net.netlink.link-add": _n("netlink RTM_NEWLINK: a new interface", DENIED),
    "net.interfaces.beyond-lo": _n("find an interface other than lo", refused),
    "net.tun.create": _n("create a tun interface (gVisor's /dev/net/tun)",
                         failed("EPERM", "EACCES")),
    "net.dns.resolve": _n("resolve a public name", refused),
    "net.unix.host-abstract": _n("connect to a host abstract Unix socket (runsc's)",
                                 failed("ECONNREFUSED")),
    "fs.root.write": _f("create a file in the read-only root", DENIED),
    "fs.root.overwrite-agent": _f("open the agent binary for writing", DENIED_THERE),
    "fs.etc.write": _f("create a file in /etc", DENIED),
    "fs.tmp.write": _f("create a file in /tmp", DENIED),
    "fs.host.marker-read": _f("read a file the test put in the host's /etc", failed("ENOENT"),
                              "marker"),
    "fs.host.shadow-read": _f("read /etc/shadow", failed("ENOENT", "EACCES")),
    "fs.proc.pid1-root": _f("escape through /proc/1/root", refused, category="proc"),
    "fs.proc.pid1-environ": _f("read a host service's environment via /proc/1", refused,
                               category="proc"),
    "fs.proc.sys-core-pattern": _f("write /proc/sys/kernel/core_pattern", DENIED, "sysctl",
                                   category="proc"),
    "fs.proc.sys-hostname": _f("write /proc/sys/kernel/hostname", DENIED, "sysctl",
                               category="proc"),
    "fs.proc.sysrq-trigger": _f("write /proc/sysrq-trigger", DENIED, category="proc"),
    "fs.sys.write": _f("write a /sys knob", refused, "sysctl", category="proc"),
    "fs.mount.tmpfs": _f("mount a tmpfs", DENIED),
    "fs.mount.remount-root-rw": _f("remount / read-write", DENIED),
    "fs.mount.bind-proc": _f("bind /proc over the workspace", DENIED),
    "fs.umount.workspace": _f("unmount /workspace", DENIED),
    "fs.umount.sockets": _f("unmount the sockets dir", DENIED_THERE, "sockets"),
    "fs.pivot-root": _f("pivot_root into the workspace", DENIED),
    "fs.chroot": _f("chroot into the workspace", DENIED),
    "fs.mknod.char-mem": _f("mknod /dev/mem (c 1:1) in the workspace and read it", DENIED),
    "fs.mknod.block-disk": _f("mknod a disk (b 8:0) in the workspace and read it", DENIED),
    "fs.symlink.host-state": _f("symlink in the workspace to the host's state.db", DENIED),
    "fs.symlink.sockets-dir": _f("plant a symlink in the sockets dir", DENIED_THERE, "sockets"),
    "fs.hardlink.agent-binary": _f("hard-link the agent binary into the workspace",
                                   DENIED_THERE),
    "fs.hardlink.session-key": _f("hard-link the session key into the workspace", DENIED_THERE,
                                  "key"),
    "fs.sockets.create": _f("bind a new socket in the sockets dir", DENIED_THERE, "sockets"),
    "fs.sockets.replace": _f("rename a socket over control.sock", DENIED_THERE, "sockets"),
    "fs.sockets.unlink": _f("unlink control.sock", DENIED_THERE, "sockets"),
    "fs.inbound.write": _f("open inbound.db for writing", DENIED_THERE, "inbound"),
    "fs.inbound.rename": _f("rename inbound.db", DENIED_THERE, "inbound"),
    "fs.key.write": _f("open the session key for writing", DENIED_THERE, "key"),
    "fs.key.chmod": _f("chmod the session key 0666", DENIED_THERE, "key"),
    "fs.dev.nodes": _f("open a hardware or host-kernel device in /dev", refused),
    "priv.setuid-0": _k("setuid(0)", failed("EPERM"), category="privileges"),
    "priv.setresuid-0": _k("setresuid(0, 0, 0)", failed("EPERM"), category="privileges"),
    "priv.setgid-0": _k("setgid(0)", failed("EPERM"), category="privileges"),
    "priv.capset-all": _k("capset: raise every capability", failed("EPERM"),
                          category="privileges"),
    "priv.capabilities-held": _k("hold any capability", refused, category="privileges"),
    # gVisor implements user namespaces itself: the unshare works, and gives nothing of the host.
    "priv.unshare-user": _k("unshare a user namespace and reach the host", refused,
                            category="privileges"),
    "priv.unshare-mount": _k("unshare a mount namespace and mount", DENIED, "mounts",
                             category="privileges"),
    "priv.unshare-net": _k("unshare a network namespace", DENIED, "netns",
                           category="privileges"),
    "priv.unshare-user-net": _k("unshare user+net namespaces for an interface", refused,
                                "netns", category="privileges"),
    "priv.setns-host-net": _k("setns into the daemon's network namespace", DENIED,
                              category="privileges"),
    "kernel.ptrace.host-pid": _k("PTRACE_ATTACH to the daemon's host pid", DENIED),
    "kernel.ptrace.pid1": _k("PTRACE_ATTACH to the box's init", DENIED),
    "kernel.process-vm-readv.host-pid": _k("process_vm_readv of the daemon", DENIED),
    "kernel.bpf.map-create": _k("bpf(BPF_MAP_CREATE)", DENIED),
    "kernel.bpf.prog-load": _k("bpf(BPF_PROG_LOAD)", DENIED),
    "kernel.perf-event-open": _k("perf_event_open, system-wide", DENIED),
    "kernel.keyctl.add-key": _k("add_key to the session keyring", DENIED),
    "kernel.keyctl.read-user-keyring": _k("keyctl read of the user keyring", DENIED),
    "kernel.userfaultfd": _k("userfaultfd()", DENIED),
    # gVisor's sentry implements io_uring itself; the host's is behind the sentry's seccomp.
    "kernel.io-uring-setup": _k("io_uring_setup reaching the host kernel's io_uring",
                                lambda r: True, "seccomp"),
    "kernel.module.init": _k("init_module", DENIED, "modules"),
    "kernel.module.finit": _k("finit_module", DENIED, "modules"),
    "kernel.module.delete": _k("delete_module(overlay)", DENIED, "modules"),
    "kernel.kexec-load": _k("kexec_load", DENIED),
    "kernel.reboot": _k("reboot(2)", DENIED),
    "kernel.personality.read-implies-exec": _k("personality(READ_IMPLIES_EXEC)", refused),
    "kernel.iopl": _k("iopl(3)", DENIED),
    "kernel.sethostname": _k("sethostname", DENIED, "hostname"),
    "kernel.settimeofday": _k("settimeofday to 1970", DENIED),
    "kernel.open-by-handle-at": _k("open_by_handle_at (shocker)", DENIED),
    "kernel.syslog-clear": _k("clear the kernel log", DENIED),
    "kernel.acct": _k("switch on process accounting", DENIED),
    "kernel.swapon": _k("swapon a workspace file", DENIED),
}  # fmt: skip

# Each fact is read or the snapshot fails: a missing file (or a netns name that does not exist)
# would hash as empty before and after alike, and an attack on it would pass unseen. The netns
# is entered through the sandbox unit's main process: the session keeps no /run/netns name.
SNAPSHOT = r"""
set -euo pipefail
sid=$1; marker=$2
sockets=/run/ironclaw/sessions/$sid
inbound=/var/lib/ironclaw/queues/$sid/inbound/inbound.db
key=/run/ironclaw/keys/$sid
missing() { echo "snapshot: $1" >&2; exit 1; }
for f in "$inbound" "$key" "$marker"; do [ -f "$f" ] || missing "no file $f"; done
[ -S "$sockets/control.sock" ] || missing "no socket $sockets/control.sock"
pid=$(systemctl show -P MainPID "ironclaw-sbx-$sid.service")
[ "${pid:-0}" -gt 0 ] || missing "ironclaw-sbx-$sid.service has no main process"
h() { sha256sum | cut -c1-16; }
net() { nsenter --net="/proc/$pid/ns/net" ip "$@"; }
v=$( { net -o link; net -o addr; net route show table all; net -6 route show table all; } | h)
echo "netns $v"
v=$(stat -c '%n %i %F %a %U' "$sockets"/* | h); echo "sockets $v"
v=$(cat "$inbound" | h); echo "inbound $v"
v=$( { cat "$key"; stat -c '%i %a %U' "$key"; } | h); echo "key $v"
v=$(cat /proc/sys/kernel/core_pattern /proc/sys/kernel/hostname | h); echo "sysctl $v"
v=$(uname -n | h); echo "hostname $v"
v=$(find /var/lib/ironclaw/rootfs -xdev -printf '%p %s %m %U %T@\n' | sort | h); echo "rootfs $v"
v=$(cut -d' ' -f4- /proc/self/mountinfo | sort | h); echo "mounts $v"
v=$(cat "$marker" | h); echo "marker $v"
# /sys/module: every loaded module has a directory there (this kernel has no /proc/modules).
v=$(ls /sys/module | h); echo "modules $v"
echo "daemon $(systemctl is-active ironclawd || true) $(systemctl show -P MainPID ironclawd)"
"""


@dataclass
class Battle:
    box: Sandbox
    raw: dict[str, Raw]
    before: dict[str, str]
    after: dict[str, str]
    listener_evidence: str
    seccomp: str
    pooled: bool = False  # the box is a warm pool's, claimed by its session


def snapshot(sysd: SystemdHarness, sid: str) -> dict[str, str]:
    proc = sysd.run(["bash", "-c", SNAPSHOT, "snapshot", sid, MARKER])
    assert proc.returncode == 0, out(proc)
    return dict(line.split(" ", 1) for line in proc.stdout.decode().splitlines())


def sandbox_seccomp(sysd: SystemdHarness, unit: str) -> str:
    """The Seccomp mode of the unit's runsc-sandbox process (2: a filter is in force)."""
    script = f"""
        for p in /proc/[0-9]*; do
            grep -qE ':/.*/{unit}$' "$p/cgroup" 2>/dev/null || continue
            [ "$(tr '\\0' ' ' < $p/cmdline | cut -d' ' -f1)" = runsc-sandbox ] \
                && grep ^Seccomp: $p/status
        done
    """
    return out(sh(sysd, script)).strip()


def _listener_evidence(listener: HostListener) -> str:
    accepted = listener.accept(timeout=1)
    datagram = listener.receive(timeout=1)
    if accepted is not None:
        accepted.close()
    return f"host listener: tcp accepted={accepted is not None}, udp received={datagram!r}"


@pytest.fixture(scope="module", params=SANDBOX_KINDS)
def battle(daemon: SystemdHarness, request: pytest.FixtureRequest) -> Iterator[Battle]:
    """Every attack in one sandbox of each kind: cold, and a warm pool's claimed one."""
    pooled = request.param == "pooled"
    assert sh(daemon, f"echo host-secret > {MARKER}").returncode == 0
    try:
        with contextlib.ExitStack() as stack:
            if pooled:
                stack.enter_context(pooled_daemon(daemon))
            sessions = stack.enter_context(module_sessions(daemon, pooled=pooled))
            listener = stack.enter_context(open_listener())
            box = sessions.create()
            assert box.send("hello").endswith("hello")  # inbound.db exists; the agent answers
            abstract = [
                line.split()[-1] for line in out(
                    daemon.run(box.in_netns("cat", "/proc/net/unix"))
                ).splitlines() if "@runsc-sandbox" in line
            ]  # fmt: skip
            assert abstract, "control: runsc's abstract socket in the session's netns"
            pid = out(daemon.run(["systemctl", "show", "-P", "MainPID", "ironclawd"])).strip()
            before = snapshot(daemon, box.sid)
            raw: dict[str, Raw] = {}
            raw.update(
                box.attacks(
                    "network",
                    host_port=listener.port,
                    abstract=abstract[0].replace("@", "\0").encode().hex(),
                )
            )
            raw.update(box.attacks("filesystem", host_marker=MARKER))
            raw.update(box.attacks("kernel", host_pid=pid))
            after = snapshot(daemon, box.sid)
            evidence = _listener_evidence(listener)
            yield Battle(
                box, raw, before, after, evidence, sandbox_seccomp(daemon, box.unit), pooled
            )
            assert box.state() == RUNNING
    finally:
        daemon.run(["rm", "-f", MARKER])


def test_every_probe_ran(battle: Battle) -> None:
    assert set(battle.raw) == set(SPECS), set(battle.raw) ^ set(SPECS)


def host_unchanged(battle: Battle, aims: tuple[str, ...]) -> tuple[bool, str]:
    changed = [k for k in ("daemon", *aims) if k in battle.before
               and battle.before[k] != battle.after[k]]  # fmt: skip
    notes = []
    ok = not changed
    if "listener" in aims:
        notes.append(battle.listener_evidence)
        ok = ok and "accepted=False" in battle.listener_evidence
        ok = ok and "received=None" in battle.listener_evidence
    if "seccomp" in aims:
        notes.append(f"runsc-sandbox {battle.seccomp or 'Seccomp: ?'}")
        ok = ok and battle.seccomp.split() == ["Seccomp:", "2"]
    notes.append(f"host unchanged: {', '.join(('daemon', *aims))}" if not changed
                 else f"host CHANGED: {', '.join(changed)}")  # fmt: skip
    return ok, "; ".join(notes)


@pytest.mark.parametrize("attack_id", sorted(SPECS))
def test_attack(battle: Battle, ledger: Ledger, attack_id: str) -> None:
    spec = SPECS[attack_id]
    raw = battle.raw[attack_id]
    inside = raw["ok"] is not None and spec.inside(raw)
    host_ok, host_note = host_unchanged(battle, spec.aims)
    evidence = f"{raw['errno'] or ('succeeded' if raw['ok'] else 'refused')}: {raw['detail']}"
    record(
        ledger, f"{attack_id}.pooled" if battle.pooled else attack_id, spec.category,
        f"{spec.title} (a warm pool's sandbox)" if battle.pooled else spec.title,
        inside and host_ok, f"{evidence[:300]}; {host_note}", error=raw["ok"] is None,
    )  # fmt: skip
    assert raw["ok"] is not None, f"probe error: {raw}"
    assert inside, f"{attack_id} was not contained inside the box: {json.dumps(raw)}"
    assert host_ok, f"{attack_id}: {host_note}"
