"""Reading a skill folder from disk: ironctl's side of formats/skill.py (the daemon never does).

Only regular, non-executable, non-hidden files in plain directories are read, without following
symlinks; anything else is refused naming its path and what was expected. What is read is then
checked by :func:`ironclawd.formats.skill.load` like any payload.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from ironclawd.errors import InvalidArgument
from ironclawd.formats.skill import MAX_DEPTH, MAX_FILE_BYTES, MAX_FILES, SIGNATURE_FILE


def read_folder(folder: Path) -> tuple[str, dict[str, bytes], str | None]:
    """(name, files, signature text or None) of a skill folder; InvalidArgument naming the path
    for anything but regular, non-executable, non-hidden files and plain directories."""
    root = folder.resolve()
    if not root.is_dir():
        raise InvalidArgument(f"{folder}: expected a skill folder")
    files: dict[str, bytes] = {}
    signature: str | None = None
    for rel, path in _walk(root, ""):
        if rel == SIGNATURE_FILE:
            data = _read(path, rel, MAX_FILE_BYTES)
            try:
                signature = data.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidArgument(f"{rel}: not a minisign signature (not text)") from None
            continue
        files[rel] = _read(path, rel, MAX_FILE_BYTES)
        if len(files) > MAX_FILES:
            raise InvalidArgument(
                f"{folder}: more than {MAX_FILES} files; a skill has at most {MAX_FILES}"
            )
    return root.name, files, signature


def _walk(directory: Path, prefix: str) -> Iterable[tuple[str, Path]]:
    with os.scandir(directory) as entries:
        listing = sorted(entries, key=lambda e: e.name)
    for entry in listing:
        rel = f"{prefix}{entry.name}"
        mode = entry.stat(follow_symlinks=False).st_mode
        if entry.name.startswith("."):
            raise InvalidArgument(f"{rel}: hidden; expected no hidden files or directories")
        if stat.S_ISLNK(mode):
            raise InvalidArgument(f"{rel}: a symlink; expected regular files only")
        if stat.S_ISDIR(mode):
            if rel.count("/") + 1 >= MAX_DEPTH:
                raise InvalidArgument(
                    f"{rel}: nested too deep; expected at most {MAX_DEPTH} levels"
                )
            yield from _walk(Path(entry.path), rel + "/")
            continue
        if not stat.S_ISREG(mode):
            raise InvalidArgument(f"{rel}: a special file; expected regular files only")
        if mode & 0o7111:
            raise InvalidArgument(
                f"{rel}: mode {stat.S_IMODE(mode):04o} is executable or "
                "set-id; expected a plain file (chmod a-x,ug-s)"
            )
        yield rel, Path(entry.path)


def _read(path: Path, rel: str, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidArgument(f"{rel}: expected a regular file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise InvalidArgument(f"{rel}: more than {limit} bytes; expected at most {limit}")
    return data
