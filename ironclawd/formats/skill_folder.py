"""Reading a skill folder from disk, and writing its signature: ironctl's side of
formats/skill.py (the daemon never does).

Only regular, non-executable, non-hidden files in plain directories are read, without following
symlinks, through descriptors of the directories (``dir_fd``), never by path; anything else is
refused naming its path and what was expected. What is read is then checked by
:func:`ironclawd.formats.skill.load` like any payload.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from ironclawd.errors import InvalidArgument
from ironclawd.formats.skill import MAX_DEPTH, MAX_FILE_BYTES, MAX_FILES, SIGNATURE_FILE


def read_folder(folder: Path) -> tuple[str, dict[str, bytes], str | None]:
    """(name, files, signature text or None) of a skill folder; InvalidArgument naming the path
    for anything but regular, non-executable, non-hidden files and plain directories."""
    fd = open_folder(folder)
    try:
        return read_opened(fd, folder)
    finally:
        os.close(fd)


def open_folder(folder: Path) -> int:
    """A descriptor of the skill folder (to close), opened without following a symlink at its
    last step. Everything read or written then goes through it (``dir_fd``), never by path:
    ``ironctl skill sign`` runs as root in folders another user owns, who could swap a name
    for a symlink between a check and a use."""
    root = folder.resolve()
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise InvalidArgument(f"{folder}: expected a skill folder") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a symlink since resolve()
            raise InvalidArgument(f"{folder}: a symlink; expected a skill folder") from None
        raise


def read_opened(fd: int, folder: Path) -> tuple[str, dict[str, bytes], str | None]:
    """read_folder of the folder ``fd`` (open_folder) that ``folder`` names."""
    files: dict[str, bytes] = {}
    signature: str | None = None
    for rel, dir_fd, name in _walk(fd, ""):
        if rel == SIGNATURE_FILE:
            data = _read(dir_fd, name, rel, MAX_FILE_BYTES)
            try:
                signature = data.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidArgument(f"{rel}: not a minisign signature (not text)") from None
            continue
        files[rel] = _read(dir_fd, name, rel, MAX_FILE_BYTES)
        if len(files) > MAX_FILES:
            raise InvalidArgument(
                f"{folder}: more than {MAX_FILES} files; a skill has at most {MAX_FILES}"
            )
    return folder.resolve().name, files, signature


def write_signature(fd: int, text: str) -> None:
    """Put ``text`` in SKILL.minisig of the folder ``fd`` (open_folder): a new file of its own,
    created beside it (O_EXCL, O_NOFOLLOW) and renamed over the name. Whatever the folder's
    owner put at SKILL.minisig meanwhile (a symlink to /etc/shadow, a hard link) is replaced,
    never written through (open(2) with O_TRUNC would follow the one and fill the other)."""
    temporary = f".{SIGNATURE_FILE}.{os.urandom(8).hex()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    out = os.open(temporary, flags, 0o644, dir_fd=fd)
    try:
        with os.fdopen(out, "wb") as handle:
            os.fchmod(handle.fileno(), 0o644)  # a signature is public, whatever the umask
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, SIGNATURE_FILE, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=fd)
        raise
    os.fsync(fd)


def _walk(dir_fd: int, prefix: str) -> Iterator[tuple[str, int, str]]:
    """(path in the skill, descriptor of its directory, name there) of each file; the
    descriptor is open until the next item is asked for."""
    with os.scandir(dir_fd) as entries:
        listing = sorted((e.name, e.stat(follow_symlinks=False).st_mode) for e in entries)
    for name, mode in listing:
        rel = f"{prefix}{name}"
        if name.startswith("."):
            raise InvalidArgument(f"{rel}: hidden; expected no hidden files or directories")
        if stat.S_ISLNK(mode):
            raise InvalidArgument(f"{rel}: a symlink; expected regular files only")
        if stat.S_ISDIR(mode):
            if rel.count("/") + 1 >= MAX_DEPTH:
                raise InvalidArgument(
                    f"{rel}: nested too deep; expected at most {MAX_DEPTH} levels"
                )
            sub = _open_directory(dir_fd, name, rel)
            try:
                yield from _walk(sub, rel + "/")
            finally:
                os.close(sub)
            continue
        if not stat.S_ISREG(mode):
            raise InvalidArgument(f"{rel}: a special file; expected regular files only")
        if mode & 0o7111:
            raise InvalidArgument(
                f"{rel}: mode {stat.S_IMODE(mode):04o} is executable or "
                "set-id; expected a plain file (chmod a-x,ug-s)"
            )
        yield rel, dir_fd, name


def _open_directory(dir_fd: int, name: str, rel: str) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped since it was listed
            raise InvalidArgument(f"{rel}: not a plain directory; expected one") from None
        raise


def _read(dir_fd: int, name: str, rel: str, limit: int) -> bytes:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # swapped for a symlink since it was listed
            raise InvalidArgument(f"{rel}: a symlink; expected regular files only") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidArgument(f"{rel}: expected a regular file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise InvalidArgument(f"{rel}: more than {limit} bytes; expected at most {limit}")
    return data
