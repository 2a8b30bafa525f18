"""The operator's trusted skill keys (``ports.TrustedKeys``): ``*.pub`` files in a directory.

Read on every check, so that adding or removing a key file takes effect at once (removing a key
also stops the approval of a pending skill it signed). Only regular files are read, without
following symlinks, each at most 4 KiB (a minisign public key file is two short lines), and only
root's (or the reader's) that nobody else may write.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from ironclawd import paths

MAX_KEY_FILE = 4096


class TrustedKeyDir:
    def __init__(self, directory: Path = paths.SKILLS_TRUSTED_DIR) -> None:
        self.directory = directory

    def read(self) -> Mapping[str, str]:
        """Name -> text of every readable ``*.pub``; a missing directory trusts nothing."""
        out: dict[str, str] = {}
        try:
            entries = sorted(os.scandir(self.directory), key=lambda e: e.name)
        except FileNotFoundError:
            return out
        for entry in entries:
            if entry.name.endswith(".pub") and not entry.name.startswith("."):
                data = _read_key(entry.path)
                if data is not None:
                    out[entry.name] = data.decode("utf-8", "replace")
        return out


def _read_key(path: str) -> bytes | None:
    """The file's bytes if it is a regular file (not through a symlink) of at most
    MAX_KEY_FILE bytes, owned by root (or this process's user) and writable by nobody else,
    as the daemon's config file must be; else None: not a key the operator placed here."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None  # a symlink (ELOOP), or gone
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None  # a directory or a FIFO named *.pub
        if info.st_uid not in (0, os.geteuid()) or info.st_mode & 0o022:
            return None  # someone else could have put his own key here
        data = os.read(fd, MAX_KEY_FILE + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= MAX_KEY_FILE else None
