"""The outbound directory's kernel-enforced quota: a per-session tmpfs.

A tmpfs with ``size=`` and ``nr_inodes=`` caps bytes and files in the kernel, so a box that
writes past them gets ENOSPC inside and the host disk is never touched; ``nosuid,nodev,noexec``
make whatever the box plants inert (setid bits are also stripped, see store/outbound.py).
It is mounted when the session first starts and stays until the session is removed, so replies
survive sandbox stops and daemon restarts; a host reboot empties it (the sandbox dies then too):
that is the trade for a quota the kernel enforces without a loop device per session.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ironclawd.errors import HostError
from ironclawd.linux import MNT_DETACH, MS_NODEV, MS_NOEXEC, MS_NOSUID, UMOUNT_NOFOLLOW
from ironclawd.linux import libc as _libc

LEGACY_FILE = "outbound.db"


@dataclass(frozen=True)
class OutboundQuota:
    max_bytes: int
    max_files: int


def is_mounted(directory: Path) -> bool:
    return os.path.ismount(directory)


def mount_outbound(directory: Path, uid: int, gid: int, quota: OutboundQuota) -> None:
    """Mount the session's outbound tmpfs on ``directory`` unless it is already there; an
    outbound.db an older version left on disk is carried over."""
    if is_mounted(directory):
        return
    legacy = _read_legacy(directory, uid, quota.max_bytes)
    # nr_inodes counts the root directory too.
    options = (
        f"size={quota.max_bytes},nr_inodes={quota.max_files + 1},mode=0700,uid={uid},gid={gid}"
    )
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if _libc.mount(b"ironclaw-outbound", bytes(directory), b"tmpfs", flags, options.encode()):
        err = ctypes.get_errno()
        raise HostError(f"mounting the outbound tmpfs on {directory}: {os.strerror(err)}")
    if legacy is not None:
        fd = os.open(directory / LEGACY_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                     | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)  # fmt: skip
        try:
            os.write(fd, legacy)
            os.fchown(fd, uid, gid)
        finally:
            os.close(fd)


def _read_legacy(directory: Path, uid: int, max_bytes: int) -> bytes | None:
    try:  # O_PATH: nothing is opened until fstat says it is the agent's regular file
        path_fd = os.open(directory / LEGACY_FILE, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(path_fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_size > max_bytes:
            return None
        fd = os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(path_fd)
    try:
        return os.read(fd, max_bytes)
    finally:
        os.close(fd)


def unmount_outbound(directory: Path) -> None:
    """Unmount the outbound tmpfs if it is mounted (lazily if something still holds it)."""
    if not is_mounted(directory):
        return
    path = bytes(directory)
    if _libc.umount2(path, UMOUNT_NOFOLLOW) == 0:
        return
    if ctypes.get_errno() == errno.EBUSY and _libc.umount2(path, UMOUNT_NOFOLLOW | MNT_DETACH) == 0:
        return
    raise HostError(f"unmounting {directory}: {os.strerror(ctypes.get_errno())}")
