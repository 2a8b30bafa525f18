"""Extract one package layer (the unpack helper's tar) into an image tree being built.

Runs in the daemon, as root, on bytes an unprivileged helper produced from a ``.deb``: nothing
in them is trusted. Every member is checked again with ``formats/deb_layer.check_member`` and
tarfile's ``data`` filter, then written by this module rather than by ``tarfile.extract``: each
name is created relative to a directory descriptor opened with ``O_NOFOLLOW`` from ``staging``
down, files with ``O_CREAT|O_EXCL|O_NOFOLLOW`` (never through an existing name, never over a
file another package wrote), so no symlink, earlier member or race can aim a write outside
``staging`` (docs/style.md §12). tarfile's own extraction would open an existing name and write
through it. A path the base image already has (other than as a directory, and through no
symlink of the base) is refused: a package never shadows the base. Files are root-owned 0444 or
0555, new directories root-owned 0755 (the image builder seals them later).
"""

from __future__ import annotations

import errno
import io
import os
import stat
import tarfile
from pathlib import Path

from ironclawd.errors import HostError, PolicyDenied
from ironclawd.formats.deb_layer import MAX_LAYER_BYTES, MAX_LAYER_MEMBERS, check_member

FILE_MODE = 0o444
EXEC_MODE = 0o555
DIR_MODE = 0o755
ROOT_UID = ROOT_GID = 0
TAR_END = bytes(2 * tarfile.BLOCKSIZE)  # tar(5): two zero blocks end an archive
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


def extract_layer(tar_bytes: bytes, staging: Path, base: Path) -> list[str]:
    """Write the members of ``tar_bytes`` under ``staging`` and return their relative paths
    (tar order; directories too, also those that already existed). PolicyDenied names the member
    and why; on error part of the layer may be written (the caller deletes ``staging``)."""
    written: list[str] = []
    total = members = 0
    try:
        staging_fd = os.open(staging, _DIR_FLAGS)
    except OSError as exc:
        raise HostError(f"extracting a layer into {staging}: {exc}") from exc
    try:
        with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:", encoding="utf-8") as tar:
            while (info := tar.next()) is not None:
                members += 1
                total += info.size
                if members > MAX_LAYER_MEMBERS or total > MAX_LAYER_BYTES:
                    raise PolicyDenied(f"layer: more than {MAX_LAYER_MEMBERS} members or "
                                       f"{MAX_LAYER_BYTES} bytes")  # fmt: skip
                path = check_member(info)
                if path == "":
                    continue
                where = f"layer member {path!r}"
                _data_filter(info, staging, where)
                _check_base(base, path, info.isdir(), where)
                _write(tar, info, path, staging_fd, where)
                written.append(path)
            # tarfile takes a stream cut at a header boundary for a whole archive: a helper that
            # died half-way must not pass for a smaller layer.
            if tar_bytes[tar.offset : tar.offset + len(TAR_END)] != TAR_END:
                raise PolicyDenied("layer: truncated tar (no end-of-archive blocks)")
    except tarfile.TarError as exc:
        raise PolicyDenied(f"layer: not a tar archive we read: {exc}") from exc
    except OSError as exc:
        raise HostError(f"extracting a layer into {staging}: {exc}") from exc
    finally:
        os.close(staging_fd)
    return written


def _data_filter(info: tarfile.TarInfo, staging: Path, where: str) -> None:
    """tarfile's own ``data`` filter (PEP 706) as a second opinion; its result is not used.
    Only where the interpreter has it (Python 3.11.4 and later): the .deb's daemon runs on
    Debian 12's 3.11.2, which has none, and ``check_member`` is the rule either way."""
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is None:
        return
    try:
        data_filter(info, str(staging))
    except tarfile.TarError as exc:  # tarfile.FilterError and its kinds
        raise PolicyDenied(f"{where}: refused by tarfile's data filter: {exc}") from exc


def _check_base(base: Path, path: str, is_dir: bool, where: str) -> None:
    """Refuse ``path`` if the base image has it (a directory may join a directory) or reaches
    it through anything but real directories."""
    parts = path.split("/")
    for depth in range(1, len(parts) + 1):
        prefix = "/".join(parts[:depth])
        try:
            mode = os.lstat(base / prefix).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(mode) or (depth == len(parts) and not is_dir):
            raise PolicyDenied(
                f"{where}: would shadow /{prefix} of the base image ({_kind(mode)}); "
                "a package may only add new files"
            )


def _write(tar: tarfile.TarFile, info: tarfile.TarInfo, path: str, root: int, where: str) -> None:
    *parents, name = path.split("/")
    parent = _open_parents(root, parents, where)
    try:
        if info.isdir():
            _make_dir(parent, name, where)
        elif info.issym():
            try:
                os.symlink(info.linkname, name, dir_fd=parent)
            except FileExistsError:
                raise _collision(where) from None
            os.chown(name, ROOT_UID, ROOT_GID, dir_fd=parent, follow_symlinks=False)
        else:
            _write_file(tar, info, name, parent, where)
    finally:
        os.close(parent)


def _open_parents(root: int, parents: list[str], where: str) -> int:
    """A descriptor of the member's parent directory, creating missing ones (root, 0755);
    PolicyDenied if one exists as anything but a real directory."""
    current = os.dup(root)
    try:
        for depth, name in enumerate(parents):
            _make_dir(current, name, where, shown="/".join(parents[: depth + 1]))
            following = os.open(name, _DIR_FLAGS, dir_fd=current)
            os.close(current)
            current = following
    except BaseException:
        os.close(current)
        raise
    return current


def _make_dir(parent: int, name: str, where: str, shown: str | None = None) -> None:
    """Create directory ``name`` in ``parent`` (root, 0755) unless a real directory is there."""
    try:
        os.mkdir(name, DIR_MODE, dir_fd=parent)
    except FileExistsError:
        mode = os.lstat(name, dir_fd=parent).st_mode
        if not stat.S_ISDIR(mode):
            what = f"its parent {shown} is" if shown is not None else "it is"
            raise PolicyDenied(
                f"{where}: {what} already in the image as {_kind(mode)}; "
                "expected a real directory (two packages, one path)"
            ) from None
        return
    os.chown(name, ROOT_UID, ROOT_GID, dir_fd=parent, follow_symlinks=False)
    os.chmod(name, DIR_MODE, dir_fd=parent, follow_symlinks=False)  # umask would narrow it


def _write_file(
    tar: tarfile.TarFile, info: tarfile.TarInfo, name: str, parent: int, where: str
) -> None:
    try:
        fd = os.open(name, _FILE_FLAGS, 0o600, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ELOOP):
            raise _collision(where) from None
        raise
    with open(fd, "wb") as writer:
        source = tar.extractfile(info)
        assert source is not None  # a regular file always has data
        left = info.size
        while left > 0:
            chunk = source.read(min(_CHUNK, left))
            if not chunk:
                raise PolicyDenied(f"{where}: file data ends early")
            writer.write(chunk)
            left -= len(chunk)
        writer.flush()
        os.fchown(fd, ROOT_UID, ROOT_GID)
        # fchmod after fchown: chown(2) clears setuid/setgid bits, and we set none anyway.
        os.fchmod(fd, EXEC_MODE if info.mode & 0o111 else FILE_MODE)
        os.fsync(fd)


def _collision(where: str) -> PolicyDenied:
    return PolicyDenied(f"{where}: already in the image (two packages, one file)")


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a file"
    return "a special file"
