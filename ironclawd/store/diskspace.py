"""Free space on the state directory's filesystem, and recognising "the disk is full" in the
errors of the file system (ENOSPC, EDQUOT) and of SQLite (SQLITE_FULL), so that every adapter
translates it once into ``DiskFull``."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

import sqlcipher3

from ironclawd.errors import DiskFull

SQLITE_FULL = 13
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (an OSError, a sqlcipher3 or sqlite3 error) says the filesystem is full."""
    if isinstance(exc, OSError):
        return exc.errno in _FULL_ERRNOS
    if isinstance(exc, (sqlcipher3.Error, sqlite3.Error)):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            return int(code) & 0xFF == SQLITE_FULL
        return "database or disk is full" in str(exc)
    return False


def check_free(state_dir: Path, min_free_bytes: int, doing: str) -> None:
    """Refuse (DiskFull) ``doing`` while the filesystem of ``state_dir`` has less than
    ``min_free_bytes`` available to the daemon (0 turns the check off)."""
    if min_free_bytes <= 0:
        return
    try:
        st = os.statvfs(state_dir)
    except OSError:
        return  # the write itself will say what is wrong
    free = st.f_bavail * st.f_frsize
    if free < min_free_bytes:
        raise DiskFull(
            f"{doing}: refused: the state directory {state_dir} has {free} bytes free, below "
            f"daemon.min_free_bytes = {min_free_bytes}; free space there (nothing acknowledged "
            "is lost; it resumes by itself)"
        )
