"""The sessions' outbound tmpfs live in a mount namespace of the daemon's own (issue 17).

Each running session used to add one mount (its outbound tmpfs) to the host's table, and systemd
copies the host's table into every new sandbox unit's mount namespace, then walks it again for
each path an option protects: ~0.5 ms of every unit start per running session, creation ~1.3x
slower at 500 sessions (docs/development.md, "Why creation slows with the session count").

So the tmpfs are mounted in a namespace of our own instead (``OutboundSpace``):

* One thread of the daemon (``ironclaw-mntns``) leaves the process's shared file-system context
  (``unshare(CLONE_FS)``) and enters that namespace; every mount and unmount of an outbound
  tmpfs runs on it (``call``). The rest of the daemon stays in the host's namespace and reaches
  the namespace's files through ``/proc/<pid>/task/<tid>/root`` (``view``): the kernel's path
  walk crosses that link into the namespace (never hand such a path to SQLite, which resolves
  links by their text).
* The namespace is kept by a bind mount of its ``nsfs`` file under ``pin_dir`` (a small private
  tmpfs of its own under /run/ironclaw), so it outlives daemon restarts as the host mounts did;
  a host reboot empties /run, as it emptied the tmpfs. Made from a copy of the host's table, it
  keeps only the mounts on the way to the queues directory (no other file system stays busy
  because of it) and all of them private: nothing propagates either way.
* A sandbox unit gets a clone of its session's tmpfs (``open_tree(OPEN_TREE_CLONE)``, a mount
  in no table) as its standard input; ``host/outbound_exec.py`` moves it onto the outbound
  directory inside the unit's namespace, after systemd built that namespace, then execs runsc
  (``/bin/sh`` first moves the clone to descriptor 3: Python will not start with a directory as
  its standard input).

Needs, in ironclawd.service: ``RestrictNamespaces=`` allowing ``mnt``, and ``CAP_SYS_CHROOT``
(``setns`` into a mount namespace, after a restart).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import errno
import logging
import os
import queue
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

from ironclawd.errors import HostError
from ironclawd.linux import (
    CLONE_FS,
    CLONE_NEWNS,
    MNT_DETACH,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_REC,
    UMOUNT_NOFOLLOW,
)
from ironclawd.linux import libc as _libc

log = logging.getLogger("ironclawd.mountns")

T = TypeVar("T")
_Job = tuple[Callable[..., Any], tuple[Any, ...], "concurrent.futures.Future[Any]"]

SYS_OPEN_TREE: Final = 428  # x86_64 and aarch64 share the new mount API's numbers
OPEN_TREE_CLONE: Final = 1
OPEN_TREE_CLOEXEC: Final = os.O_CLOEXEC
AT_FDCWD: Final = -100
THREAD_NAME: Final = "ironclaw-mntns"  # at most 15 bytes: the kernel's thread name
PR_SET_NAME: Final = 15
ONLINE: Final = "/sys/devices/system/cpu/online"
EXEC_SCRIPT: Final = Path(__file__).with_name("outbound_exec.py")


def _check(result: int, doing: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise HostError(f"outbound mount namespace: {doing}: {os.strerror(err)}")
    return result


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes come octal-escaped."""
    if "\\" not in field:
        return field
    return field.encode().decode("unicode_escape").encode("latin-1").decode()


def mount_points(mountinfo: str) -> list[str]:
    """The mount points listed in a ``/proc/*/mountinfo`` text, in its order."""
    return [_unescape(line.split(" ", 5)[4]) for line in mountinfo.splitlines() if line]


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def to_drop(points: Sequence[str], keep: str) -> list[str]:
    """Of ``points``, those the namespace does not need, deepest first: all but the mounts on
    the way to ``keep`` (its ancestors), those at or below it, and /proc (glibc's
    ``fchmodat(AT_SYMLINK_NOFOLLOW)`` goes through /proc/self/fd)."""
    drop = [p for p in points if not (_within(keep, p) or _within(p, keep) or p == "/proc")]
    return sorted(set(drop), key=lambda p: (-p.count("/"), p))


def online_cpus(listing: str | None = None) -> list[int]:
    """The online CPUs' numbers, from ``/sys/devices/system/cpu/online`` (e.g. ``0,2-5``: they
    need not be contiguous), or ``0..cpu_count-1`` where it cannot be read."""
    cpus: list[int] = []
    try:
        text = listing if listing is not None else Path(ONLINE).read_text()
        for part in text.strip().split(","):
            first, _, last = part.partition("-")
            cpus.extend(range(int(first), int(last or first) + 1))
    except (OSError, ValueError):
        return list(range(os.cpu_count() or 1))
    return cpus


class OutboundSpace:
    """``ports.MountSpace``: the daemon's mount namespace for outbound tmpfs (module doc)."""

    def __init__(self, pin_dir: Path, keep: Path) -> None:
        self.pin_dir = pin_dir
        self.pin = pin_dir / "ns"
        self.keep = keep
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._tid = 0
        self.joined = False  # True: an earlier daemon's namespace; False: made by this one

    # --- start -------------------------------------------------------------------------------

    def start(self) -> None:
        """Enter the pinned namespace, or make and pin a new one; move what an older version
        mounted on the host (outbound tmpfs below ``keep``) out of the host's table."""
        self.keep.mkdir(mode=0o711, parents=True, exist_ok=True)
        st = os.stat(self.keep)
        started: concurrent.futures.Future[bool] = concurrent.futures.Future()
        thread = threading.Thread(target=self._serve, args=(started, (st.st_dev, st.st_ino)),
                                  name=THREAD_NAME, daemon=True)  # fmt: skip
        thread.start()
        self.joined = started.result()
        if not self.joined:
            self._pin()
            self._clear_host()

    def _serve(self, started: concurrent.futures.Future[bool], keep_id: tuple[int, int]) -> None:
        try:
            self._tid = threading.get_native_id()
            # The kernel's name of this thread too (ps, tests): Python 3.11 leaves it unset.
            _libc.prctl(PR_SET_NAME, THREAD_NAME.encode(), 0, 0, 0)
            started.set_result(self._enter(keep_id))
        except BaseException as exc:
            started.set_exception(exc)
            return
        while True:
            fn, args, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

    def _enter(self, keep_id: tuple[int, int]) -> bool:
        """Join the pinned namespace if it shows ``keep`` as the host does; else make one."""
        host = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)  # the main thread's
        try:
            _check(_libc.unshare(CLONE_FS), "unshare(CLONE_FS)")
            joined = self._join()
            if joined and self._shows_keep(keep_id):
                return True
            if joined:  # back to the host's namespace, to copy it
                _check(_libc.setns(host, CLONE_NEWNS), "returning to the host's mount namespace")
        finally:
            os.close(host)
        return self._make()

    def _join(self) -> bool:
        try:
            fd = os.open(self.pin, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            if _libc.setns(fd, CLONE_NEWNS) == 0:
                return True
            if ctypes.get_errno() != errno.EINVAL:  # EINVAL: a plain file, nothing pinned
                _check(-1, f"entering the namespace pinned at {self.pin}")
            return False
        finally:
            os.close(fd)

    def _shows_keep(self, keep_id: tuple[int, int]) -> bool:
        try:
            st = os.stat(self.keep)
            seen: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            seen = None
        if seen == keep_id:
            return True
        # Made for another state directory, or before the one in use was mounted: its view of
        # the queues is not the host's. What it holds (stopped sessions' outbound queues of
        # that view) goes with it; a session's next start rebuilds its queue from the record.
        log.warning("outbound mount namespace: the one pinned at %s does not show %s as the "
                    "host does (the state directory changed?); a new one replaces it",
                    self.pin, self.keep)  # fmt: skip
        return False

    def _make(self) -> bool:
        _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
        with open("/proc/thread-self/mountinfo", encoding="utf-8") as f:
            points = mount_points(f.read())
        for point in to_drop(points, str(self.keep)):
            if _libc.umount2(point.encode(), MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
                err = ctypes.get_errno()
                if err not in (errno.EINVAL, errno.ENOENT):  # gone with its parent already
                    log.warning("outbound mount namespace: leaving %s mounted: %s", point,
                                os.strerror(err))  # fmt: skip
        return False

    def _pin(self) -> None:
        """Bind the new namespace's nsfs file under ``pin_dir``, a private tmpfs (a pin below a
        shared mount would propagate, and into the namespace itself it would be a loop)."""
        self.pin_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        d = bytes(self.pin_dir)
        if not os.path.ismount(self.pin_dir):
            flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
            mounted = _libc.mount(b"ironclaw-mntns", d, b"tmpfs", flags, b"size=16k,mode=0700")
            _check(mounted, f"mounting a tmpfs on {self.pin_dir}")
        _check(_libc.mount(None, d, None, MS_PRIVATE, None), f"making {self.pin_dir} private")
        if os.path.ismount(self.pin):
            _check(_libc.umount2(bytes(self.pin), MNT_DETACH), f"unpinning a stale {self.pin}")
        fd = os.open(self.pin, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.close(fd)
        source = f"/proc/{os.getpid()}/task/{self._tid}/ns/mnt".encode()
        # The kernel refuses (EINVAL) to bind a mount namespace's file into one whose id is not
        # lower: its guard against loops. Since Linux 6.18 the ids come from per-CPU batches, so
        # a namespace made later on another CPU can have the lower id (one daemon start in ten
        # failed so under the test harness, whose namespace is not the boot one). A copy of the
        # namespace made on each CPU in turn gets an id of that CPU's batch; the CPU that made
        # ours has the batch that goes on above it.
        for cpu in [None, *online_cpus()]:
            if cpu is not None and not self.call(self._renew_on, cpu):
                continue
            if _libc.mount(source, bytes(self.pin), None, MS_BIND, None) == 0:
                if cpu is not None:
                    log.info("outbound mount namespace: pinned once renewed on CPU %d (its id "
                             "was below this namespace's)", cpu)  # fmt: skip
                return
            if ctypes.get_errno() != errno.EINVAL:
                break
        _check(-1, f"pinning at {self.pin}")

    def _renew_on(self, cpu: int) -> bool:
        """On the namespace's thread: replace its namespace by a copy of it (same mounts, all
        private, so nothing changes but the id) made on ``cpu``; False if ``cpu`` is not one
        this thread may run on."""
        allowed = os.sched_getaffinity(0)
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError:
            return False
        try:
            _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        finally:
            os.sched_setaffinity(0, allowed)
        return True

    def _clear_host(self) -> None:
        """Outbound tmpfs an older version mounted on the host: the namespace holds copies of
        them now (same file systems, same data), so the host's copies go."""
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            points = [p for p in mount_points(f.read())
                      if _within(p, str(self.keep)) and p != str(self.keep)]  # fmt: skip
        for point in sorted(points, key=lambda p: -p.count("/")):
            if _libc.umount2(point.encode(), MNT_DETACH | UMOUNT_NOFOLLOW) == 0:
                log.info("outbound mount namespace: moved %s off the host's mount table", point)

    # --- use ---------------------------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        """``ports.MountSpace.health``: the pin must hold the namespace this daemon's thread is
        in. Without it, the next start makes a new, empty namespace, and the daemon would no
        longer see the outbound tmpfs of the sessions that run meanwhile."""
        try:
            in_use = os.stat(f"/proc/self/task/{self._tid}/ns/mnt").st_ino
        except OSError as exc:
            return False, f"the namespace's thread ({THREAD_NAME}) is gone: {exc.strerror}"
        try:
            pinned = os.stat(self.pin).st_ino if os.path.ismount(self.pin) else None
        except OSError:
            pinned = None
        if pinned is None:
            return False, f"nothing is pinned at {self.pin}"
        if pinned != in_use:
            return False, f"{self.pin} pins another namespace than the one in use"
        how = "joined at start" if self.joined else "made at start"
        return True, f"pinned at {self.pin} ({how}); the queues' tmpfs are mounted there"

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the namespace's thread: paths there are the namespace's."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, args, future))
        return future.result()

    def view(self, path: Path) -> Path:
        """``path`` as the namespace sees it, for the daemon's other threads."""
        return Path(f"/proc/{os.getpid()}/task/{self._tid}/root") / path.relative_to("/")

    def clone(self, path: Path) -> int:
        """A detached clone of the mount at ``path`` (close-on-exec): systemd hands it to a
        sandbox unit, whose wrapper mounts it."""

        def clone_here() -> int:
            return _check(
                _libc.syscall(SYS_OPEN_TREE, AT_FDCWD, bytes(path),
                              OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC),
                f"cloning the mount at {path}",
            )  # fmt: skip

        return self.call(clone_here)

    def exec_argv(self, target: Path, argv: Sequence[str]) -> list[str]:
        """The sandbox unit's command line: the wrapper that mounts its standard input on
        ``target``, then execs ``argv``."""
        shell = ["/bin/sh", "-c", 'exec 3<&0 </dev/null && exec "$@"', "outbound_exec"]
        return [*shell, sys.executable, "-I", "-S", str(EXEC_SCRIPT), str(target), "--", *argv]
