"""Empty network namespaces under /run/netns, one per session (docs/architecture.md §3 "Network").

A session's namespace holds the loopback device and nothing else: no other link, no address, no
route in any table of either family. Loopback is left *down*: nothing in the runsc process tree
needs it (runsc's parent, gofer and sandbox talk over socketpairs and pathname Unix sockets, and
with ``--network=none`` the sandbox has a loopback of its own inside gVisor's netstack), and a
down loopback keeps the namespace free of the local routes the kernel adds when lo goes up, so
``verify`` can demand "no route at all" without exceptions.

Namespaces are made the way ``ip netns add`` makes them (so ``ip netns exec`` works for
operators): ``/run/netns`` is a shared mount point, and each namespace is a bind mount of an nsfs
file onto an empty file there. The name lives only while a sandbox is being set up: once the
sandbox unit's process has joined the namespace (and holds it), the session releases the name
(services/session_lifecycle.py); operators reach a running session's namespace through its
unit's main process, ``nsenter --net=/proc/<MainPID>/ns/net``. Nothing here forks: the
namespace is entered or made by a short-lived thread, because ``unshare(CLONE_NEWNET)`` and
``setns(fd, CLONE_NEWNET)`` change only the calling thread (unshare(2), setns(2)), and a netlink
socket belongs to the namespace of the thread that opened it. pyroute2's own helpers fork, which
is unsafe in a daemon with gRPC threads.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ironclawd import lazy_re
from ironclawd.errors import HostError, InvalidArgument
from ironclawd.linux import CLONE_NEWNET, MNT_DETACH, MS_BIND, MS_REC, MS_SHARED, UMOUNT_NOFOLLOW
from ironclawd.linux import libc as _libc
from ironclawd.paths import NETNS_DIR

# A file name we create as root in a shared directory: a strict charset, no dots at the start,
# bounded so that it also fits in unit names and log lines.
_NAME_RE = lazy_re.compile(r"^ironclaw-[a-z0-9][a-z0-9-]{0,54}$")

NSFS_MAGIC = 0x6E736673  # linux/magic.h
NS_GET_NSTYPE = 0xB703  # _IO(0xb7, 0x3), linux/nsfs.h, Linux >= 4.11

_T = TypeVar("_T")


def validate_name(name: str) -> str:
    """Return ``name`` if it is a valid session netns name, else raise InvalidArgument."""
    if not _NAME_RE.fullmatch(name):
        raise InvalidArgument(
            f"netns name {name!r}: expected 'ironclaw-' followed by 1-55 of [a-z0-9-]"
        )
    return name


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _run_in_thread(fn: Callable[[], _T]) -> _T:
    """Run ``fn`` in a fresh thread (which may change its own netns) and return its result."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller, re-raised there
            box["error"] = exc

    worker = threading.Thread(target=target, name="ironclaw-netns", daemon=True)
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def _fs_type(fd: int) -> int:
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on x86_64/arm64
    _check(_libc.fstatfs(fd, buf), "fstatfs")
    return int.from_bytes(buf.raw[: ctypes.sizeof(ctypes.c_long)], sys.byteorder)


class NetnsAdapter:
    """NetnsManager over /run/netns (or another directory, for tests)."""

    def __init__(self, run_dir: Path = NETNS_DIR) -> None:
        self._dir = run_dir

    def _path(self, name: str) -> Path:
        return self._dir / validate_name(name)

    def create(self, name: str) -> Path:
        """Make an empty netns ``name``; verified before returning; rolled back on any failure."""
        path = self._path(name)
        try:
            self._ensure_shared_dir()
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0)
            os.close(fd)
        except FileExistsError as exc:
            raise HostError(f"creating netns {name}: {path} already exists") from exc
        except OSError as exc:
            raise HostError(f"creating netns {name}: {exc}") from exc
        try:
            _run_in_thread(lambda: self._unshare_and_bind(path))
            return self.verify(name)
        except BaseException as exc:
            self.delete(name)
            if isinstance(exc, HostError):
                raise
            raise HostError(f"creating netns {name}: {exc}") from exc

    @staticmethod
    def _unshare_and_bind(path: Path) -> None:
        _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        # /proc/self would name the thread group leader's namespace, not this thread's.
        src = b"/proc/thread-self/ns/net"
        _check(_libc.mount(src, bytes(path), b"none", MS_BIND, None), f"bind-mounting {path}")

    def _ensure_shared_dir(self) -> None:
        # As iproute2 does: make the directory a shared mount point so that netns mounts
        # propagate to peer mount namespaces (and `ip netns` sees the same thing).
        self._dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        d = bytes(self._dir)
        if _libc.mount(b"none", d, None, MS_SHARED | MS_REC, None) == 0:
            return
        if ctypes.get_errno() != errno.EINVAL:  # EINVAL: not a mount point yet
            _check(-1, f"making {self._dir} shared")
        _check(_libc.mount(d, d, b"none", MS_BIND | MS_REC, None), f"bind-mounting {self._dir}")
        _check(_libc.mount(b"none", d, None, MS_SHARED | MS_REC, None), f"sharing {self._dir}")

    def verify(self, name: str) -> Path:
        """Prove ``/run/netns/<name>`` is a netns mount with only ``lo`` and no route at all."""
        path = self._path(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            reason = "is a symlink" if exc.errno == errno.ELOOP else exc.strerror
            raise HostError(f"verifying netns {name}: {path} {reason}") from exc
        try:
            self._check_is_netns(fd, path)
            links, addrs, routes = _run_in_thread(lambda: _inspect(fd))
        except OSError as exc:
            raise HostError(f"verifying netns {name}: {exc}") from exc
        finally:
            os.close(fd)
        if links != ["lo"]:
            raise HostError(f"verifying netns {name}: expected only lo, found links {links}")
        if addrs:
            raise HostError(f"verifying netns {name}: expected no address, found {addrs}")
        if routes:
            raise HostError(f"verifying netns {name}: expected no route, found {routes}")
        return path

    @staticmethod
    def _check_is_netns(fd: int, path: Path) -> None:
        # nsfs files can only appear at a path through a bind mount, so the magic number also
        # proves the path is a mount point; the ioctl lets the kernel name the namespace type.
        if not stat.S_ISREG(os.fstat(fd).st_mode) or _fs_type(fd) != NSFS_MAGIC:
            raise HostError(f"{path} is not a namespace file (not an nsfs mount)")
        try:
            nstype = fcntl.ioctl(fd, NS_GET_NSTYPE)
        except OSError as exc:
            raise HostError(f"{path}: NS_GET_NSTYPE failed: {exc.strerror}") from exc
        if nstype != CLONE_NEWNET:
            raise HostError(f"{path} is a namespace of type {nstype:#x}, not a network namespace")
        # The daemon runs in the host's namespace; a bind mount of that one must never pass.
        # (/proc/1/ns/net is not used: it can be unreadable even to root, e.g. in a container.)
        st, own = os.fstat(fd), os.stat("/proc/self/ns/net")
        if (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino):
            raise HostError(f"{path} is the daemon's own network namespace")

    def delete(self, name: str) -> None:
        """Unmount and remove ``/run/netns/<name>``; a missing namespace is not an error."""
        path = self._path(name)
        if _libc.umount2(bytes(path), MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
            err = ctypes.get_errno()
            if err not in (errno.EINVAL, errno.ENOENT):  # EINVAL: not a mount point
                raise HostError(f"deleting netns {name}: umount {path}: {os.strerror(err)}")
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise HostError(f"deleting netns {name}: {exc}") from exc

    def list_names(self, prefix: str) -> list[str]:
        """Names under the netns directory that start with ``prefix`` and are valid names."""
        try:
            entries = os.listdir(self._dir)
        except FileNotFoundError:
            return []
        return sorted(e for e in entries if e.startswith(prefix) and _NAME_RE.fullmatch(e))


def _inspect(fd: int) -> tuple[list[str], list[str], list[str]]:
    """In the calling (throwaway) thread: enter the netns of ``fd``, list links/addrs/routes."""
    # Imported here, before the setns, not at start: pyroute2 costs ~70 ms of the daemon's
    # start-up and only session creation needs it (issue 17).
    from pyroute2 import IPRoute  # noqa: PLC0415

    _check(_libc.setns(fd, CLONE_NEWNET), "setns(CLONE_NEWNET)")
    with IPRoute() as ipr:
        links = sorted(str(link.get_attr("IFLA_IFNAME")) for link in ipr.get_links())
        addrs = [str(a.get_attr("IFA_ADDRESS")) for a in ipr.get_addr()]
        routes = [
            f"{r.get_attr('RTA_DST')}/{r['dst_len']} table {r.get_attr('RTA_TABLE')}"
            for family in (socket.AF_INET, socket.AF_INET6)
            for r in ipr.get_routes(family=family)  # every table: no table filter
        ]
    return links, addrs, routes
