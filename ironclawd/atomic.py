"""``atomic_write``: a file that appears whole or not at all, the one way this code writes one.

A temp file beside the target (``O_EXCL | O_NOFOLLOW``: nothing planted there is followed or
reused), written in full, given its mode (and owner), fsynced, then renamed onto the target, or
linked to it when an existing file must win; the directory is fsynced after, since a rename is
durable only once the directory entry is on disk (fsync(2) NOTES). The temp file is removed on
any failure. Shared by every layer (bundle, store, tests), so it imports nothing of the daemon.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def atomic_write(
    path: Path | str,
    data: bytes,
    *,
    mode: int = 0o600,
    dir_fd: int | None = None,
    owner: tuple[int, int] | None = None,
    replace: bool = True,
    durable: bool = True,
) -> bool:
    """Write ``data`` to ``path`` atomically; True if this call's file is now there.

    ``dir_fd``: ``path`` is a name in that open directory (no path is resolved again).
    ``owner``: (uid, gid) given to the file before it appears. ``replace=False``: an existing
    file is kept and False returned (two processes creating the same key: the first wins).
    ``durable=False``: no fsync (a tmpfs, where there is no disk to reach).
    """
    path = Path(path)
    temp = str(path.with_name(f".{path.name}.tmp-{secrets.token_hex(8)}"))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, mode, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)  # the umask may have taken bits off at open
            if owner is not None:
                os.fchown(fd, *owner)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.rename(temp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            written = True
        else:
            try:
                os.link(temp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
                written = True
            except FileExistsError:
                written = False
            os.unlink(temp, dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=dir_fd)
        raise
    if durable and written:
        _fsync_dir(path.parent, dir_fd)
    return written


def _fsync_dir(directory: Path, dir_fd: int | None) -> None:
    if dir_fd is not None:
        os.fsync(dir_fd)
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
