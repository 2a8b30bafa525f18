"""Boot a private systemd for tests and demos, and tear it down without a trace.

The recipe (docs/development.md, "The private systemd"): new PID,
mount and UTS namespaces; an overlay whose lower layer is the host's root (or, with ``lower=``,
another root tree such as a debootstrapped Debian) and whose upper layer is a tmpfs;
`pivot_root` into it; `exec systemd`. systemd at boot runs tmpfiles, sysusers, sysctl,
modules-load, udev and timers against whatever it sees, so everything it could reach on the host
is either private (overlay, tmpfs, a `/dev` of its own), read-only (`/proc/sys`, `/sys`) or masked.

Usage as a program (from the repository root)::

    python -m tests.harness.private_systemd --bind "$PWD" -- systemctl list-units

Stdlib only: this runs before anything is installed.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from types import TracebackType

SYSTEMD = "/lib/systemd/systemd"
TARGET = "ironclaw-harness.target"
MNTNS_PIN = "/run/ironclaw/mntns/ns"  # ironclawd's outbound mount namespace (paths.MOUNTNS_DIR)
OWNER_FILE = "ironclaw-harness-owner.json"
CGROUP_ROOT = Path("/sys/fs/cgroup")
BOOT_TIMEOUT = 90.0
CLOSE_TIMEOUT = 30.0
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,40}$")

# Units that fail in any container and do not matter to us ("degraded" caused by
# modules-load is expected). Anything else failing is a real problem and is reported.
EXPECTED_FAILURES = frozenset(
    {
        "systemd-modules-load.service",
        "sys-kernel-config.mount",
        "sys-kernel-debug.mount",
        "sys-kernel-tracing.mount",
        "sys-fs-fuse-connections.mount",
        "systemd-remount-fs.service",
    }
)

# Units masked inside because they act on kernel-global or host state that no mount namespace
# hides: sysctls (kernel.pid_max is set by Debian's 50-pid-max.conf), kernel modules, binfmt,
# pstore (deletes the host's crash records), udev (replays every host device's uevent), the
# clock, and timers (apt-daily would reach the network; fstrim/e2scrub act on the host's disk).
MASKED_UNITS = (
    "systemd-sysctl.service",
    "systemd-modules-load.service",
    "systemd-binfmt.service",
    "proc-sys-fs-binfmt_misc.automount",
    "proc-sys-fs-binfmt_misc.mount",
    "systemd-pstore.service",
    "systemd-udevd.service",
    "systemd-udevd-control.socket",
    "systemd-udevd-kernel.socket",
    "systemd-udev-trigger.service",
    "systemd-udev-settle.service",
    "systemd-timesyncd.service",
    "systemd-tmpfiles-clean.timer",
    "timers.target",
)

# Environment that would point commands inside at host-side objects.
_HOST_ONLY_ENV = (
    "NOTIFY_SOCKET",
    "DBUS_SESSION_BUS_ADDRESS",
    "DBUS_SYSTEM_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
)

# Runs as PID 1 of the new namespaces, then becomes systemd. Arguments: the bind paths.
_BOOT_SCRIPT = r"""
set -eu
state=$H_STATE
m=$state/merged
for d in $H_CGROUP_DIRS; do mkdir -p "$d"; done
for d in $H_CGROUPS; do echo 0 > "$d/cgroup.procs"; done
mount --make-rprivate /
mount -t tmpfs -o mode=0700 ironclaw-harness "$state"
mkdir "$state/upper" "$state/work" "$m"
mount -t overlay overlay -o "lowerdir=$H_LOWER,upperdir=$state/upper,workdir=$state/work" "$m"
mount -t proc proc "$m/proc"
mount --bind "$m/proc/sys" "$m/proc/sys"
mount -o remount,bind,ro "$m/proc/sys"
mount --rbind /sys "$m/sys"
mount -o remount,bind,ro "$m/sys"
mount -t tmpfs -o mode=0755,nosuid tmpfs "$m/dev"
mknod -m 0666 "$m/dev/null" c 1 3
mknod -m 0666 "$m/dev/zero" c 1 5
mknod -m 0666 "$m/dev/full" c 1 7
mknod -m 0666 "$m/dev/random" c 1 8
mknod -m 0666 "$m/dev/urandom" c 1 9
mknod -m 0666 "$m/dev/tty" c 5 0
if [ -e /dev/net/tun ]; then mkdir "$m/dev/net"; mknod -m 0666 "$m/dev/net/tun" c 10 200; fi
if [ -e /dev/fuse ]; then mknod -m 0666 "$m/dev/fuse" c 10 229; fi
if [ -e /dev/kvm ]; then mknod -m 0660 "$m/dev/kvm" c 10 232; fi
touch "$m/dev/console"
mount --bind "$m/dev/null" "$m/dev/console"
mkdir "$m/dev/pts" "$m/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$m/dev/pts"
ln -s pts/ptmx "$m/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev shm "$m/dev/shm"
ln -s /proc/self/fd "$m/dev/fd"
ln -s /proc/self/fd/0 "$m/dev/stdin"
ln -s /proc/self/fd/1 "$m/dev/stdout"
ln -s /proc/self/fd/2 "$m/dev/stderr"
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$m/run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$m/tmp"
for b in "$@"; do mkdir -p "$m$b"; mount --rbind "$b" "$m$b"; done
mkdir -p "$m/run/systemd/system" "$m/run/systemd/system.control" "$m/run/tmpfiles.d"
printf '%s\n' "$H_TARGET_UNIT" > "$m/run/systemd/system/$H_TARGET"
for u in $H_MASK; do ln -s /dev/null "$m/run/systemd/system.control/$u"; done
printf 'd /tmp 1777 root root -\nd /var/tmp 1777 root root -\n' > "$m/run/tmpfiles.d/tmp.conf"
hostname "$H_NAME"
mkdir "$m/run/.oldroot"
cd "$m"
pivot_root . run/.oldroot
cd /
umount -l /run/.oldroot
rmdir /run/.oldroot
exec env -i container="$H_NAME" PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    "$H_SYSTEMD" --system --unit="$H_TARGET"
"""

_TARGET_UNIT = """[Unit]
Description=IronClaw private systemd for tests
Requires=basic.target dbus.socket
After=basic.target dbus.socket
AllowIsolate=yes
"""


class HarnessError(RuntimeError):
    """The private systemd could not be booted, used or torn down cleanly."""


class SystemdHarness:
    """A systemd to run commands under: the interface tests rely on."""

    pid: int
    workdir: Path
    is_private: bool = False

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        input: bytes | None = None,
        check: bool = False,
        timeout: float | None = 120,
        env: Mapping[str, str] | None = None,
        capture: bool = True,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run argv under this systemd (as `user` if given, groups from its /etc/group)."""
        if env is None:
            env = {k: v for k, v in os.environ.items() if k not in _HOST_ONLY_ENV}
        prefix = [*self._enter_argv(), "env", "-C", str(self.workdir)]
        if user is not None:
            prefix += self._drop_privileges_argv(user)
        return _run_bounded(
            [*prefix, *argv], input=input, check=check, timeout=timeout, env=env, capture=capture
        )

    def host_path(self, path: str | os.PathLike[str]) -> Path:
        """The host-side path of `path` as seen inside (files, sockets)."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop this systemd and everything it started; idempotent."""

    def outbound_path(self, path: str | os.PathLike[str]) -> Path:
        """The host-side path of ``path`` as ironclawd's outbound mount namespace sees it: the
        sessions' outbound tmpfs are mounted there, not in this systemd's own view. Found
        through the daemon's thread that lives in that namespace (named ``ironclaw-mntns``),
        afresh at each call (a restart makes a new one)."""
        return Path(f"/proc/{self._mntns_tid()}/root") / str(path).lstrip("/")

    def in_outbound_ns(self, argv: Sequence[str]) -> list[str]:
        """``argv`` (by ``run``, an absolute program) inside ironclawd's outbound mount
        namespace, which holds little but the queues (``findmnt``, ``umount``, ``du``)."""
        return ["nsenter", f"--mount={MNTNS_PIN}", "--", *argv]

    def _mntns_tid(self) -> int:
        pidns = os.stat(f"/proc/{self.pid}/ns/pid").st_ino
        for comm in Path("/proc").glob("[0-9]*/task/*/comm"):
            with contextlib.suppress(OSError):
                if comm.read_text().strip() != "ironclaw-mntns":
                    continue
                if os.stat(comm.parent / "ns" / "pid").st_ino == pidns:
                    return int(comm.parent.name)
        raise HarnessError("no ironclawd thread in its outbound mount namespace (is it running?)")

    def _enter_argv(self) -> list[str]:
        return []

    def _drop_privileges_argv(self, user: str) -> list[str]:
        # setpriv, unlike su/runuser, needs no PAM session; it runs after nsenter has entered the
        # mount namespace, so names and --init-groups resolve against the private /etc files.
        entry = self.run(["getent", "passwd", user], timeout=30)
        if entry.returncode != 0:
            raise HarnessError(f"running as {user!r}: no such user inside")
        _name, _pw, uid, gid, _gecos, home, _shell = entry.stdout.decode().strip().split(":", 6)
        return [
            f"HOME={home}",
            f"USER={user}",
            f"LOGNAME={user}",
            "setpriv",
            f"--reuid={uid}",
            f"--regid={gid}",
            "--init-groups",
            "--",
        ]

    def __enter__(self) -> SystemdHarness:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class HostSystemd(SystemdHarness):
    """The host's own systemd (PID 1): commands run directly, paths are the host's."""

    def __init__(self, workdir: Path) -> None:
        self.pid = 1
        self.workdir = workdir

    def host_path(self, path: str | os.PathLike[str]) -> Path:
        return Path(path)


class PrivateSystemd(SystemdHarness):
    """A systemd booted in private namespaces; see the module docstring."""

    is_private = True

    def __init__(
        self,
        *,
        proc: subprocess.Popen[bytes],
        pid: int,
        state_dir: Path,
        cgroup_rel: str,
        workdir: Path,
        log: tempfile._TemporaryFileWrapper[bytes],
    ) -> None:
        self._proc = proc
        self.pid = pid
        self.state_dir = state_dir
        self.cgroup_rel = cgroup_rel
        self.workdir = workdir
        self._log = log
        self._closed = False
        self.boot_seconds = 0.0
        atexit.register(self.close)

    @classmethod
    def boot(
        cls,
        binds: Sequence[str | os.PathLike[str]],
        name: str = "ironclaw-test",
        *,
        timeout: float = BOOT_TIMEOUT,
        lower: str | os.PathLike[str] | None = None,
    ) -> SystemdHarness:
        """Boot a private systemd with `binds` writable inside; wait until it is ready.

        With IRONCLAW_USE_HOST_SYSTEMD=1 on a host booted with systemd, return the host's
        instead (unless `lower` is given). The first bind is the working directory of commands
        run inside. `lower`: a root tree to boot instead of the host's root (it is the overlay's
        read-only lower layer: never written, shareable by concurrent boots; its own systemd
        runs, at SYSTEMD inside it).
        """
        paths = [Path(b).resolve(strict=True) for b in binds]
        workdir = paths[0] if paths else Path("/")
        lower_dir = Path(lower).resolve(strict=True) if lower is not None else Path("/")
        if lower is not None:
            if lower_dir == Path("/"):
                raise HarnessError("booting private systemd: lower= the host's root is the default")
            if not (lower_dir / SYSTEMD.lstrip("/")).exists():
                raise HarnessError(f"booting private systemd: no {SYSTEMD} in {lower_dir}")
            # overlayfs takes ':' as the separator of lower layers and ',' of options.
            if re.search(r"[:,\\\s]", str(lower_dir)):
                raise HarnessError(f"booting private systemd: unusable lower path {lower_dir}")
        elif (
            os.environ.get("IRONCLAW_USE_HOST_SYSTEMD") == "1"
            and Path("/run/systemd/system").is_dir()
        ):
            return HostSystemd(workdir)
        if not _NAME_RE.match(name):
            raise HarnessError(f"booting private systemd: bad name {name!r}")
        if os.geteuid() != 0:
            raise HarnessError("booting private systemd: needs root")
        sweep_stale_instances()
        instance = f"{name}-{secrets.token_hex(4)}"
        state_dir = Path("/run") / instance
        cgroup_rel = _own_cgroup() + "/" + instance
        state_dir.mkdir(mode=0o700)
        # Visible only on the host (inside, a tmpfs covers it): lets a later boot clean up after
        # an owner that died too hard for close() to run.
        owner = {"pid": os.getpid(), "start": _start_time(os.getpid()), "cgroup": cgroup_rel}
        (state_dir / OWNER_FILE).write_text(json.dumps(owner))
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "H_STATE": str(state_dir),
            "H_LOWER": str(lower_dir),
            "H_NAME": name,
            "H_TARGET": TARGET,
            "H_TARGET_UNIT": _TARGET_UNIT,
            "H_MASK": " ".join(MASKED_UNITS),
            "H_SYSTEMD": SYSTEMD,
            "H_CGROUPS": " ".join(str(d) for d in _primary_cgroup_dirs(cgroup_rel)),
            "H_CGROUP_DIRS": " ".join(str(m / cgroup_rel.lstrip("/")) for m in _cgroup_mounts()),
        }
        # setpriv --pdeathsig and unshare --kill-child: if this Python dies without cleaning up,
        # unshare is killed, and that kills the namespace's PID 1 (and so every process in it).
        argv = [
            "setpriv", "--pdeathsig=KILL", "--",
            "unshare", "--pid", "--mount", "--uts", "--fork", "--kill-child=KILL", "--",
            "/bin/sh", "-c", _BOOT_SCRIPT, "ironclaw-harness-boot", *map(str, paths),
        ]  # fmt: skip
        log = tempfile.NamedTemporaryFile(prefix=f"{instance}-", suffix=".log")  # noqa: SIM115
        started = time.monotonic()
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
        try:
            pid = _wait_for_child(proc, started + timeout)
        except HarnessError as exc:
            _kill_and_reap(proc)
            _remove_cgroups(cgroup_rel)
            _remove_state_dir(state_dir)
            raise HarnessError(f"{exc}\n{_tail(log.name)}") from None
        except BaseException:
            _kill_and_reap(proc)
            _remove_cgroups(cgroup_rel)
            _remove_state_dir(state_dir)
            raise
        self = cls(
            proc=proc, pid=pid, state_dir=state_dir, cgroup_rel=cgroup_rel, workdir=workdir,
            log=log,
        )  # fmt: skip
        try:
            self._wait_until_ready(started + timeout)
        except BaseException:
            self.close()
            raise
        self.boot_seconds = time.monotonic() - started
        return self

    def host_path(self, path: str | os.PathLike[str]) -> Path:
        return Path(f"/proc/{self.pid}/root") / str(path).lstrip("/")

    def journal_tail(self, lines: int = 40) -> str:
        """The last journal lines inside, then the console output of the boot."""
        parts = []
        with contextlib.suppress(Exception):
            r = self.run(["journalctl", "-b", "--no-pager", "-q", "-n", str(lines)], timeout=10)
            if r.stdout.strip():
                parts.append("journal:\n" + r.stdout.decode(errors="replace"))
        console = self.boot_log()
        if console.strip():
            parts.append("console:\n" + console)
        return "".join(parts) or "(no journal entries, no console output)"

    def boot_log(self) -> str:
        """What the boot script and systemd wrote to their stdout/stderr."""
        return _tail(self._log.name)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        # From outside its namespace PID 1 is an ordinary process; when it dies the kernel kills
        # every process in the PID namespace (pid_namespaces(7)) and the mount namespace, with
        # its tmpfs, overlay, /run/netns entries and sockets, goes with the last of them.
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        try:
            self._proc.wait(timeout=CLOSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            _kill_and_reap(self._proc)
        self._log.close()
        problems = []
        if _is_alive(self.pid):
            problems.append(f"pid {self.pid} still alive")
        problems += _remove_cgroups(self.cgroup_rel)
        leftover = [m for m in _mount_points() if Path(m).is_relative_to(self.state_dir)]
        if leftover:
            problems.append(f"mounts left: {leftover}")
        else:
            try:
                _remove_state_dir(self.state_dir)
            except OSError as exc:
                problems.append(f"removing {self.state_dir}: {exc}")
        if problems:
            raise HarnessError("tearing down private systemd: " + "; ".join(problems))

    def _enter_argv(self) -> list[str]:
        if self._closed:
            raise HarnessError("private systemd is closed")
        return ["nsenter", "-t", str(self.pid), "-m", "-p", "-u", "--"]

    def _wait_until_ready(self, deadline: float) -> None:
        state = ""
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise HarnessError(f"booting private systemd: PID 1 exited\n{self.boot_log()}")
            remaining = max(1.0, deadline - time.monotonic())
            try:
                r = self.run(["systemctl", "is-system-running", "--wait"], timeout=remaining)
            except subprocess.TimeoutExpired:
                break
            state = (r.stdout or r.stderr).decode(errors="replace").strip()
            if state == "running":
                return
            if state == "degraded":
                failed = set(self.failed_units())
                if failed <= EXPECTED_FAILURES:
                    return
                raise HarnessError(
                    "booting private systemd: degraded, failed units: "
                    f"{', '.join(sorted(failed - EXPECTED_FAILURES))}\n{self.journal_tail()}"
                )
            if state in ("maintenance", "stopping"):
                raise HarnessError(f"booting private systemd: {state}\n{self.journal_tail()}")
            # "offline"/empty: the manager's private socket is not there yet.
            time.sleep(0.05)
        raise HarnessError(
            f"booting private systemd: not ready after timeout (last state {state!r})\n"
            f"{self.journal_tail()}"
        )

    def failed_units(self) -> list[str]:
        """Names of units in the failed state inside."""
        r = self.run(["systemctl", "list-units", "--state=failed", "--plain", "--no-legend"])
        return [line.split()[0] for line in r.stdout.decode().splitlines() if line.strip()]


def _run_bounded(
    argv: list[str],
    *,
    input: bytes | None,
    check: bool,
    timeout: float | None,
    env: Mapping[str, str],
    capture: bool,
) -> subprocess.CompletedProcess[bytes]:
    # A session of its own, so a timeout kills nsenter *and* the child it forked inside (killing
    # only nsenter would leave the child running, adopted by the private PID 1).
    stdin = subprocess.PIPE if input is not None else (subprocess.DEVNULL if capture else None)
    out = subprocess.PIPE if capture else None
    with subprocess.Popen(
        argv, stdin=stdin, stdout=out, stderr=out, env=dict(env), start_new_session=True
    ) as proc:
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    result = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    if check:
        result.check_returncode()
    return result


def _wait_for_child(proc: subprocess.Popen[bytes], deadline: float) -> int:
    """Host PID of unshare's forked child: the new PID namespace's PID 1."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise HarnessError(f"booting private systemd: unshare exited ({proc.returncode})")
        with contextlib.suppress(FileNotFoundError):
            pids = children.read_text().split()
            # setpriv exec'd unshare, so proc.pid is unshare; its only child is PID 1.
            if pids:
                return int(pids[0])
        time.sleep(0.01)
    raise HarnessError("booting private systemd: unshare forked no child in time")


def _tail(path: str, size: int = 8000) -> str:
    with open(path, "rb") as f:
        return f.read()[-size:].decode(errors="replace")


def _kill_and_reap(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()


def _is_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _start_time(pid: int) -> str | None:
    """proc(5) field 22: tells a process from a later one that reuses its PID."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _remove_state_dir(state_dir: Path) -> None:
    (state_dir / OWNER_FILE).unlink(missing_ok=True)
    state_dir.rmdir()


def sweep_stale_instances() -> list[Path]:
    """Remove state dirs and cgroups of instances whose owner died (SIGKILL, OOM); return them.

    Their namespaces are already gone (setpriv --pdeathsig, unshare --kill-child); only the
    host-side directory under /run and empty cgroups can be left.
    """
    swept = []
    for record in Path("/run").glob(f"*/{OWNER_FILE}"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            owner = json.loads(record.read_text())
            # Only ever the instance's own subtree: a walk from a cgroup root would rmdir every
            # empty cgroup on the host.
            if PurePosixPath(str(owner["cgroup"])).name != record.parent.name:
                continue
            if _start_time(int(owner["pid"])) == owner["start"]:
                continue
            if _remove_cgroups(str(owner["cgroup"]), timeout=0):
                continue  # something still runs there: not ours to judge
            _remove_state_dir(record.parent)
            swept.append(record.parent)
    return swept


def _own_cgroup() -> str:
    """Our cgroup path in the hierarchy systemd manages (name=systemd, else the unified one)."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    paths = dict(line.split(":", 2)[1:] for line in lines)
    path = paths.get("name=systemd", paths.get("", "/"))
    return path.rstrip("/")


def _primary_cgroup_dirs(rel: str) -> list[Path]:
    # systemd in a container takes the cgroup it starts in as its root (like nspawn without a
    # cgroup namespace). Giving each instance its own keeps parallel boots apart and lets
    # close() remove exactly what this one created. On cgroup v1 systemd uses a controller only
    # if that same path exists in the controller's hierarchy (controller_is_v1_accessible() in
    # systemd 252), so it is created in every hierarchy; otherwise MemoryMax=, TasksMax= are
    # accepted and silently not enforced.
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT / rel.lstrip("/")]
    return [
        CGROUP_ROOT / h / rel.lstrip("/")
        for h in ("systemd", "unified")
        if (CGROUP_ROOT / h).is_dir()
    ]


def _cgroup_mounts() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers, name=systemd, unified)."""
    return [
        Path(point)
        for point, fstype in _mounts()
        if fstype in ("cgroup", "cgroup2") and Path(point).is_relative_to(CGROUP_ROOT)
    ]


def _remove_cgroups(rel: str, timeout: float = 10.0) -> list[str]:
    """Remove the instance's cgroup subtree in every hierarchy; return what could not be."""
    problems = []
    for mount in _cgroup_mounts():
        top = mount / rel.lstrip("/")
        if not top.is_dir():
            continue
        deadline = time.monotonic() + timeout
        while True:
            try:
                for dirpath, _dirs, _files in os.walk(top, topdown=False):
                    os.rmdir(dirpath)
                break
            except OSError as exc:
                # A cgroup whose last process just died can stay busy for a moment.
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    problems.append(f"removing cgroup {top}: {exc}")
                    break
                time.sleep(0.05)
    return problems


def _mounts() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of each mount in our mount namespace (proc(5))."""
    result = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if not fields:
                continue
            # Mount points escape space, tab, newline and backslash as octal (\040).
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            result.append((point, fields[fields.index("-") + 1]))
    return result


def _mount_points() -> list[str]:
    return [point for point, _fstype in _mounts()]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: boot, run one command inside with stdio passed through, tear down, return its code."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.harness.private_systemd",
        description="Run a command under a private systemd (or the host's, with "
        "IRONCLAW_USE_HOST_SYSTEMD=1 on a systemd host).",
    )
    parser.add_argument(
        "--bind", action="append", default=[], metavar="DIR",
        help="directory writable inside at the same path (repeatable; the first is the working "
        "directory); default: the current directory",
    )  # fmt: skip
    parser.add_argument("--name", default="ironclaw-test", help="container= and hostname")
    parser.add_argument("--timeout", type=float, default=BOOT_TIMEOUT, help="boot timeout (s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="report boot time")
    parser.add_argument("command", nargs="+", help="command to run inside (after --)")
    args = parser.parse_args(argv)

    def _exit_on_signal(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    binds = args.bind or [os.getcwd()]
    try:
        with PrivateSystemd.boot(binds, args.name, timeout=args.timeout) as sd:
            if args.verbose and isinstance(sd, PrivateSystemd):
                print(f"private systemd pid {sd.pid} ready in {sd.boot_seconds:.2f} s",
                      file=sys.stderr)  # fmt: skip
            # Inside, this systemd *is* the host's: nested harnesses (the pytest fixture) use it
            # instead of booting another one.
            env = {k: v for k, v in os.environ.items() if k not in _HOST_ONLY_ENV}
            env["IRONCLAW_USE_HOST_SYSTEMD"] = "1"
            code = sd.run(args.command, capture=False, timeout=None, env=env).returncode
    except HarnessError as exc:
        print(f"with-systemd: {exc}", file=sys.stderr)
        return 125
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
