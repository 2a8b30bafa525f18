"""Search every readable file of the box for needles (``--probe-grep``, the secrets probes)."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

JSON = dict[str, object]

# Files under /proc that are not data a process was given, and would be slow or block to read.
_GREP_SKIP_NAMES = frozenset({"mem", "pagemap", "kcore", "kmsg", "clear_refs", "kpagecount"})
GREP_MAX_FILE_BYTES = 256 * 1024 * 1024
_GREP_BLOCK = 1024 * 1024


def _grep_file(path: str, needles: Sequence[bytes]) -> tuple[int, set[int]] | None:
    """Bytes read from the regular file ``path`` and which needles it holds; None if it is not
    a regular file or cannot be opened (O_NONBLOCK: a FIFO must not hang the walk)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    found: set[int] = set()
    total = 0
    keep = max(len(n) for n in needles) - 1
    tail = b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        while total < GREP_MAX_FILE_BYTES:
            try:
                block = os.read(fd, _GREP_BLOCK)
            except OSError:
                break
            if not block:
                break
            total += len(block)
            window = tail + block  # a needle split across two reads is still found
            found.update(i for i, needle in enumerate(needles) if needle in window)
            tail = window[-keep:] if keep else b""
    finally:
        os.close(fd)
    return total, found


def grep_tree(needles: Sequence[bytes], root: str = "/") -> JSON:
    """Every regular file readable under ``root`` (symlinks not followed; /proc included, so
    each visible process's environ and cmdline, and /proc/self/environ), searched for each
    needle. Reports the files holding each, by the needle's hex (never the needle itself)."""
    hits: dict[str, list[str]] = {needle.hex(): [] for needle in needles}
    files = unreadable = total = 0
    for directory, dirs, names in os.walk(root, onerror=lambda _exc: None):
        dirs.sort()
        for name in sorted(names):
            if directory.startswith("/proc") and name in _GREP_SKIP_NAMES:
                continue
            path = os.path.join(directory, name)
            result = _grep_file(path, needles)
            if result is None:
                unreadable += 1
                continue
            files += 1
            total += result[0]
            for index in result[1]:
                hits[needles[index].hex()].append(path)
    return {"files": files, "bytes": total, "unreadable": unreadable, "hits": hits}
