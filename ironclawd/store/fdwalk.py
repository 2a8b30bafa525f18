"""Walking and removing a directory tree the box can change while we walk it.

Neither ``os.fwalk(follow_symlinks=False)`` nor ``shutil.rmtree`` is safe against a racing
writer in CPython 3.11: fwalk classifies entries with ``entry.is_dir()`` (which follows links)
and both then open the name with plain ``O_RDONLY``, so a name swapped for a symlink to a FIFO
between the check and the open is opened, and the opener blocks (seen: a root daemon thread
parked on a host FIFO). Here a directory is only ever opened
``O_DIRECTORY|O_NOFOLLOW|O_NONBLOCK``: the kernel refuses a symlink (ELOOP) and anything but a
directory (ENOTDIR) before it opens anything, whatever the name has become.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

from ironclawd.errors import HostError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_DEPTH = 64


def open_dir(name: str | Path, dir_fd: int | None = None) -> int:
    return os.open(name, DIR_FLAGS, dir_fd=dir_fd)


def visit(dir_fd: int, fn: Callable[[int, str], None], max_entries: int) -> int:
    """Call ``fn(parent_fd, name)`` for every entry below ``dir_fd`` (pre-order), at most
    ``max_entries`` of them; returns how many were visited."""
    return _visit(dir_fd, fn, max_entries, 0)


def _visit(dir_fd: int, fn: Callable[[int, str], None], budget: int, depth: int) -> int:
    seen = 0
    for name in _names(dir_fd):
        if seen >= budget:
            break
        seen += 1
        fn(dir_fd, name)
        if depth >= MAX_DEPTH:
            continue
        try:
            sub = open_dir(name, dir_fd)
        except OSError:
            continue  # not a directory (or no longer one): nothing below it
        try:
            seen += _visit(sub, fn, budget - seen, depth + 1)
        finally:
            os.close(sub)
    return seen


def _names(dir_fd: int) -> list[str]:
    with os.scandir(dir_fd) as entries:
        return [entry.name for entry in entries]


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything below it, never following a link: links are unlinked
    themselves, directories are entered only through the descriptor checked above."""
    try:
        fd = open_dir(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise HostError(f"removing {path}: {exc.strerror or exc}") from exc
    try:
        _empty(fd, 0)
    except OSError as exc:
        raise HostError(f"removing {path}: {exc}") from exc
    finally:
        os.close(fd)
    try:
        os.rmdir(path)
    except OSError as exc:
        raise HostError(f"removing {path}: {exc.strerror or exc}") from exc


def _empty(dir_fd: int, depth: int) -> None:
    for name in _names(dir_fd):
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)
            continue
        if depth >= MAX_DEPTH:
            raise OSError(f"{name}: nested deeper than {MAX_DEPTH} directories")
        sub = open_dir(name, dir_fd)
        try:
            _empty(sub, depth + 1)
        finally:
            os.close(sub)
        os.rmdir(name, dir_fd=dir_fd)
