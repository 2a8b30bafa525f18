"""Safe creation of the daemon's Unix socket directories and socket files.

The daemon is root and these paths sit in /run, so a pre-existing path is treated as hostile
until proven otherwise: a symlink, a non-root owner, a group/other-writable directory or a
non-socket file where a socket should be makes the daemon refuse to start rather than follow or
reuse it.
"""

from __future__ import annotations

import asyncio
import grp
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

from ironclawd.errors import HostError


def ensure_private_dir(path: Path, mode: int) -> None:
    """Create ``path`` (root-owned, ``mode``) or accept it only if it is already safe.

    Every ancestor must be a real directory owned by root and not writable by group or other,
    otherwise someone else could swap the path under us.
    """
    for ancestor in reversed(path.parents):
        _check_dir(ancestor, allow_sticky=True)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    except OSError as exc:
        raise HostError(f"creating {path}: {exc.strerror}") from exc
    _check_dir(path, allow_sticky=False)
    os.chmod(path, mode, follow_symlinks=False)


def ensure_shared_dir(path: Path, mode: int, *, gid: int | None = None) -> None:
    """A directory others must pass through (the admin socket's): made ``mode`` if missing,
    checked as :func:`ensure_private_dir` checks, but never widened when it was there already:
    ``admin.socket = "/root/ic.sock"`` made /root 0755 (found by a review, stop 50). One that
    others cannot pass through is refused, naming it and what to do; one of group ``gid`` (the
    admin group's) that its group may pass through is taken too (0750 root:ironclaw-admin)."""
    if not os.path.lexists(path):
        ensure_private_dir(path, mode)
        return
    for ancestor in reversed(path.parents):
        _check_dir(ancestor, allow_sticky=True)
    _check_dir(path, allow_sticky=False)
    st = os.lstat(path)
    current = stat.S_IMODE(st.st_mode)
    by_group = gid is not None and st.st_gid == gid and current & stat.S_IXGRP
    if not current & stat.S_IXOTH and not by_group:
        raise HostError(
            f"refusing {path} for the admin socket: mode {current:04o}, so the admin group's "
            "members could not reach the socket, and the daemon does not widen a directory it "
            "did not make; make it 0755 (or 0750 and of the admin group) yourself or pick "
            "another admin.socket (default /run/ironclaw/admin.sock)"
        )


def check_existing_dirs(path: Path) -> None:
    """The checks of :func:`ensure_private_dir` on the parts of ``path`` that exist already,
    without creating anything (``ironclawd --check-config``)."""
    for ancestor in reversed(path.parents):
        if not os.path.lexists(ancestor):
            return
        _check_dir(ancestor, allow_sticky=True)
    if os.path.lexists(path):
        _check_dir(path, allow_sticky=False)


def _check_dir(path: Path, *, allow_sticky: bool) -> None:
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise HostError(f"checking {path}: {exc.strerror}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise HostError(f"refusing {path}: it is a symlink, expected a directory owned by root")
    if not stat.S_ISDIR(st.st_mode):
        raise HostError(f"refusing {path}: not a directory")
    if st.st_uid != 0:
        raise HostError(f"refusing {path}: owned by uid {st.st_uid}, expected root")
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not (allow_sticky and st.st_mode & stat.S_ISVTX):
        raise HostError(
            f"refusing {path}: writable by group or other (mode {stat.S_IMODE(st.st_mode):04o})"
        )


def remove_stale_socket(path: Path) -> None:
    """Remove our own socket left by an earlier run; refuse anything else at that path."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != 0:
        kind = "symlink" if stat.S_ISLNK(st.st_mode) else "non-socket or foreign file"
        raise HostError(f"refusing to replace {path}: a {kind} is there (owner uid {st.st_uid})")
    os.unlink(path)


def bind_unix_socket(path: Path, *, mode: int, group: str | None) -> socket.socket:
    """Bind a listening Unix stream socket at ``path`` with ``mode`` and ``group``.

    The socket is created under a umask that already yields ``mode`` (no window where it is
    wider), then chowned to the group.
    """
    gid = -1
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise HostError(
                f"group '{group}' does not exist (install sysusers.d/ironclaw.conf and run "
                "systemd-sysusers)"
            ) from None
    remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o777 & ~mode)
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise HostError(f"binding {path}: {exc.strerror}") from exc
    finally:
        os.umask(old)
    os.chown(path, 0, gid, follow_symlinks=False)
    os.chmod(path, mode, follow_symlinks=False)
    sock.listen(128)
    sock.setblocking(False)
    return sock


ConnectionHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def serve_unix(
    handler: ConnectionHandler, sock: socket.socket, limit: int = 2**16
) -> asyncio.Server:
    """``asyncio.start_unix_server`` whose connection tasks never end cancelled: Python 3.11's
    done callback calls ``exception()`` on them, which raises CancelledError and logs a traceback
    for every connection still open when the daemon stops (fixed upstream in 3.12)."""

    async def quiet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        except asyncio.CancelledError:
            writer.transport.abort()  # the loop is stopping: this connection ends with it

    return await asyncio.start_unix_server(quiet, sock=sock, limit=limit)
