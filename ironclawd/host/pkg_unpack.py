"""Turn a ``.deb`` into a clean layer tar, inside the unprivileged unpack helper unit.

Runs as a DynamicUser in its own transient unit (``host/pkg_helper.py unpack``), never in the
daemon: stdlib, ``dpkg-deb`` and the pure member rules only. ``dpkg-deb --fsys-tarfile`` reads
just the package's ``data.tar`` (the control archive, with the maintainer scripts, is never
extracted, let alone run); every member is checked by ``formats/deb_layer.check_member`` and
written to a NEW uncompressed tar holding only directories, regular files and relative symlinks,
owned by root, mtime 0, modes reduced to 0755/0644. Nothing is written to disk but a temporary
copy of that output, so ``out`` receives a whole layer or nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import IO, BinaryIO

from ironclawd.errors import HostError, PolicyDenied
from ironclawd.formats.deb_layer import MAX_LAYER_BYTES, MAX_LAYER_MEMBERS, check_member

DPKG_DEB = "dpkg-deb"
FILE_MODE = 0o644
EXEC_MODE = DIR_MODE = 0o755
LINK_MODE = 0o777
STDERR_TAIL = 2000
# What may follow tar's end-of-archive blocks on dpkg-deb's stdout: the rest of the last record.
MAX_TRAILER_BYTES = 1 << 20
_CHUNK = 1 << 20


def unpack(deb: Path, out: BinaryIO) -> None:
    """Write the checked layer of ``deb`` to ``out`` as an uncompressed tar, or raise
    PolicyDenied naming the member refused and why (HostError if dpkg-deb cannot read it)."""
    where = f"unpacking {deb.name}"
    with tempfile.TemporaryFile() as errors, tempfile.TemporaryFile() as layer:
        # stderr goes to a file: a pipe nobody reads while we stream stdout could fill and
        # stall dpkg-deb.
        try:
            process = subprocess.Popen(
                [DPKG_DEB, "--fsys-tarfile", str(deb)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errors,
                env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
            )
        except OSError as exc:
            raise HostError(f"{where}: starting {DPKG_DEB}: {exc}") from exc
        try:
            _read_layer(process, layer, where, errors)
        finally:
            _stop(process)
        layer.seek(0)
        shutil.copyfileobj(layer, out, _CHUNK)
        out.flush()


def _read_layer(
    process: subprocess.Popen[bytes], layer: IO[bytes], where: str, errors: IO[bytes]
) -> None:
    """Copy dpkg-deb's checked output to ``layer``; raise if a member or dpkg-deb fails."""
    assert process.stdout is not None
    try:
        _copy_checked(process.stdout, layer, where)
        _drain(process.stdout, where)
    except tarfile.TarError as exc:
        # A tar that breaks off is, most often, dpkg-deb failing half-way: say so if it did.
        returncode = _stop(process)
        if returncode != 0:
            raise _dpkg_failed(where, returncode, errors) from exc
        raise PolicyDenied(f"{where}: data.tar is not a tar archive we read: {exc}") from exc
    except OSError as exc:
        raise HostError(f"{where}: {exc}") from exc
    returncode = _stop(process)
    if returncode != 0:
        raise _dpkg_failed(where, returncode, errors)


def _stop(process: subprocess.Popen[bytes]) -> int:
    """Wait for dpkg-deb after closing our end of its stdout (so it stops on EPIPE if it was
    still writing: a refusal need not read the rest); its exit status."""
    if process.stdout is not None:
        process.stdout.close()
    return process.wait()


def _copy_checked(source: IO[bytes], layer: IO[bytes], where: str) -> None:
    """Stream the members of ``source`` through check_member into a clean tar on ``layer``."""
    total = members = 0
    seen: set[str] = set()
    links: set[str] = set()
    with (
        tarfile.open(fileobj=source, mode="r|", encoding="utf-8") as reader,
        tarfile.open(
            fileobj=layer, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8"
        ) as writer,
    ):
        for info in reader:
            members += 1
            total += info.size
            if members > MAX_LAYER_MEMBERS:
                raise PolicyDenied(f"{where}: more than {MAX_LAYER_MEMBERS} members")
            if total > MAX_LAYER_BYTES:
                raise PolicyDenied(f"{where}: more than {MAX_LAYER_BYTES} bytes of files")
            path = check_member(info)
            if path == "":
                continue
            _check_placement(path, info, seen, links, where)
            clean = _clean_info(path, info)
            if clean.isreg():
                data = reader.extractfile(info)
                assert data is not None  # a regular file always has a data stream
                writer.addfile(clean, data)
            else:
                writer.addfile(clean)


def _check_placement(
    path: str, info: tarfile.TarInfo, seen: set[str], links: set[str], where: str
) -> None:
    """Refuse a second member of one path (unless both are directories) and a member below a
    symlink of the same package: the extractor would refuse either, say so here first."""
    parents = path.split("/")[:-1]
    for depth in range(1, len(parents) + 1):
        parent = "/".join(parents[:depth])
        if parent in links:
            raise PolicyDenied(
                f"{where}: package member {info.name!r}: lies below the symlink {parent}; "
                "expected only real directories above a member"
            )
    if path in seen and not info.isdir():
        raise PolicyDenied(f"{where}: package member {info.name!r}: appears twice")
    seen.add(path)
    if info.issym():
        links.add(path)


def _clean_info(path: str, info: tarfile.TarInfo) -> tarfile.TarInfo:
    """A fresh header for ``path``: root:root, mtime 0, 0755/0644, nothing else carried over
    (no pax headers, so no extended attributes or file capabilities either)."""
    clean = tarfile.TarInfo(path)
    clean.uid = clean.gid = 0
    clean.uname = clean.gname = "root"
    clean.mtime = 0
    if info.isdir():
        clean.type, clean.mode = tarfile.DIRTYPE, DIR_MODE
    elif info.issym():
        clean.type, clean.mode, clean.linkname = tarfile.SYMTYPE, LINK_MODE, info.linkname
    else:
        clean.type, clean.size = tarfile.REGTYPE, info.size
        clean.mode = EXEC_MODE if info.mode & 0o111 else FILE_MODE
    return clean


def _drain(source: IO[bytes], where: str) -> None:
    """Read what dpkg-deb writes after the end of the archive (record padding), bounded."""
    left = MAX_TRAILER_BYTES
    while chunk := source.read(min(_CHUNK, left + 1)):
        left -= len(chunk)
        if left < 0:
            raise PolicyDenied(f"{where}: more than {MAX_TRAILER_BYTES} bytes after the archive")


def _dpkg_failed(where: str, returncode: int, errors: IO[bytes]) -> HostError:
    errors.seek(0)
    tail = errors.read()[-STDERR_TAIL:].decode("utf-8", "replace").strip()
    return HostError(f"{where}: {DPKG_DEB} --fsys-tarfile exited {returncode}: {tail or '-'}")
