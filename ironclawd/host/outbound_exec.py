"""A sandbox unit's first program: mount the session's outbound tmpfs, then exec runsc.

Usage (host/mountns.py builds it): ``python3 -I -S outbound_exec.py <outbound dir> -- <argv>``,
with descriptor 3 a detached clone of the session's outbound tmpfs. systemd hands the clone over
as standard input (``StandardInputFileDescriptor=``), and ``/bin/sh`` moves it to 3 with
``/dev/null`` in its place: Python refuses to start with a directory as its standard input.
It runs inside the unit's mount namespace, after systemd built it, as root with the unit's
capability bounding set. Anything unexpected ends it with status 1 and a line on stderr, before
runsc starts: the directory must never be left as the host's disk directory, which has no
quota. Standard library only (``-I -S``: no site, no environment, no path of the caller's).
"""

import ctypes
import os
import stat
import sys

SYS_MOVE_MOUNT = 429  # x86_64 and aarch64
MOVE_MOUNT_F_EMPTY_PATH = 0x4
AT_FDCWD = -100
TMPFS_MAGIC = 0x01021994
ST_NOSUID, ST_NODEV, ST_NOEXEC = 2, 4, 8
CLONE_FD = 3


def _statfs_type(fd: int, libc: ctypes.CDLL) -> int:
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type is its first long
    if libc.fstatfs(fd, buf) != 0:
        raise OSError(ctypes.get_errno(), "fstatfs")
    return ctypes.c_long.from_buffer(buf).value


def attach(target: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    st = os.fstat(CLONE_FD)
    flags = os.fstatvfs(CLONE_FD).f_flag
    if not stat.S_ISDIR(st.st_mode) or _statfs_type(CLONE_FD, libc) != TMPFS_MAGIC:
        raise SystemExit("descriptor 3 is not a tmpfs (the outbound clone)")
    if flags & (ST_NOSUID | ST_NODEV | ST_NOEXEC) != ST_NOSUID | ST_NODEV | ST_NOEXEC:
        raise SystemExit("the outbound tmpfs is not nosuid,nodev,noexec")
    if libc.syscall(SYS_MOVE_MOUNT, CLONE_FD, b"", AT_FDCWD, os.fsencode(target),
                    MOVE_MOUNT_F_EMPTY_PATH) != 0:  # fmt: skip
        err = ctypes.get_errno()
        raise SystemExit(f"mounting the outbound tmpfs on {target}: {os.strerror(err)}")
    fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        mounted = os.fstat(fd)
        if (mounted.st_dev, mounted.st_ino) != (st.st_dev, st.st_ino):
            raise SystemExit(f"{target} is not the outbound tmpfs after the mount")
    finally:
        os.close(fd)
    os.close(CLONE_FD)


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--" or not os.path.isabs(argv[1]):
        raise SystemExit("usage: outbound_exec.py <outbound dir> -- <program> [args...]")
    try:
        attach(argv[1])
    except OSError as exc:
        raise SystemExit(f"outbound_exec: {exc}") from None
    os.execv(argv[3], argv[3:])  # noqa: S606 (runsc, an absolute path from the daemon)


if __name__ == "__main__":
    try:
        main(sys.argv)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            sys.stderr.write(f"ironclaw outbound_exec: {exc.code}\n")
            raise SystemExit(1) from None
        raise
