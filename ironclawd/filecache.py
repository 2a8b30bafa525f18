"""``IdentityCache``: what the daemon learnt at an earlier start about a file it did not change
since (the agent image's content digest, what a runsc binary offers), keyed by file identity.

Hashing the 55 MB agent image and asking runsc three questions cost ~0.3 s of every start
(issue 17). A file's identity here is (path, st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns):
replacing or rewriting a file changes its inode, size or times, and ctime cannot be set back
from user space (``touch -d`` sets mtime only, utimensat(2)), so a changed file misses the cache.
The files are root's (``/usr/lib/ironclaw``, ``/usr/bin/runsc``); whoever can change them can
change the daemon too.

The cache is one JSON file, root-only (0600 in a 0700 directory), written atomically; it keeps
the latest entry of each kind only, so it cannot grow. A missing, unreadable or malformed cache
is an empty one, and so is one another build of ironclawd wrote (``_build``): what it learnt came
from its own parsing, hashing and trials, which this build's may not match. Shared by the bundle
and host layers, so it imports nothing of theirs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ironclawd import __version__
from ironclawd.atomic import atomic_write

log = logging.getLogger("ironclawd.filecache")

_VERSION = 1
MAX_BYTES = 1 << 20  # far above what a few entries take; a bigger file is not ours


def file_identity(path: Path) -> str:
    """The identity of ``path`` (symlinks followed: what runs or is read is the target)."""
    st = path.stat()
    return f"{path}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"


@functools.cache
def _build() -> str:
    """The build of ironclawd running: its version and this module's file identity. Installing,
    upgrading or downgrading the package replaces every file of it (a new inode), so a cache
    another build wrote is not taken, even of the same version number."""
    return f"{__version__}\0{file_identity(Path(__file__))}"


def tree_identity(roots: Iterable[Path]) -> str:
    """A digest of the identity of every entry under ``roots`` (lstat, nothing read): any file
    added, removed, renamed, replaced or rewritten changes it."""
    digest = hashlib.sha256()
    for root in roots:
        digest.update(f"{file_identity(root)}\0".encode())
        for directory, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted([*dirs, *files]):
                st = os.lstat(os.path.join(directory, name))
                rel = os.path.relpath(os.path.join(directory, name), root)
                digest.update(
                    f"{rel}\0{st.st_mode:o}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0"
                    f"{st.st_mtime_ns}\0{st.st_ctime_ns}\n".encode()
                )
    return digest.hexdigest()


class IdentityCache:
    """Values keyed by (kind, identity key), in the root-only file ``path``."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def get(self, kind: str, key: str) -> Any:
        """The value stored for ``kind`` under exactly ``key``, else None."""
        entry = self._load().get(kind)
        if isinstance(entry, dict) and entry.get("key") == key:
            return entry.get("value")
        return None

    def put(self, kind: str, key: str, value: Any) -> None:
        """Store ``value`` for ``kind`` under ``key``, replacing the kind's previous entry. A
        cache that cannot be written is logged and skipped: the next start computes again."""
        entries = self._load()
        entries[kind] = {"key": key, "value": value}
        doc = {"version": _VERSION, "build": _build(), "entries": entries}
        data = json.dumps(doc, sort_keys=True).encode()
        try:
            self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self._path.parent, 0o700)
            atomic_write(self._path, data, mode=0o600)
        except OSError as exc:
            log.warning("start cache %s not written: %s", self._path, exc)

    def _load(self) -> dict[str, Any]:
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return {}
        try:
            with os.fdopen(fd, "rb") as f:
                raw = f.read(MAX_BYTES + 1)
        except OSError:
            return {}
        if len(raw) > MAX_BYTES:
            return {}
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return {}
        # Another ironclawd's answers are not this one's (see the module's docstring).
        if not isinstance(doc, dict) or (doc.get("version"), doc.get("build")) != (
            _VERSION,
            _build(),
        ):
            return {}
        entries = doc.get("entries")
        return dict(entries) if isinstance(entries, dict) else {}
