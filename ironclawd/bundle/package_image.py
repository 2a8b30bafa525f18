"""A per-agent image: the shared base rootfs plus the unpacked layers of the agent's approved
packages (docs/packages.md).

The image is a complete tree (runsc 20221219's gofer serves the root as one host tree, so no
overlay): the base's files hard-linked (root-owned and never written, so sharing inodes is
safe; the base itself is never modified), each package's checked layer extracted on top (a
file of the base is never shadowed: bundle/layer.py refuses it), the other shared libraries of
the packages the base already holds (libm beside libc: apt was told those packages are
installed), and ``/etc/ironclaw/programs.json``, the programs the agent's ``run`` tool may
start. Content-addressed by the base's digest and the packages' ``.deb`` hashes, built in a
sibling temp directory and renamed into place, so it appears whole or not at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from ironclawd.bundle.layer import extract_layer
from ironclawd.bundle.rootfs import EXEC_MODE, FILE_MODE, _copy_file, _fsync_dir, _seal_dirs
from ironclawd.domain.packages import AgentPackage
from ironclawd.errors import SandboxError

IMAGE_LAYOUT = "ironclaw-package-image v1"
PROGRAMS_FILE = Path("etc/ironclaw/programs.json")
PROGRAM_DIRS = ("bin", "sbin", "usr/bin", "usr/sbin", "usr/games", "usr/local/bin")


def image_digest(base: Path, packages: Sequence[AgentPackage]) -> str:
    """The image's name: its base and the exact ``.deb`` files unpacked on it."""
    debs = sorted(f"{p.name}\0{p.version}\0{p.architecture}\0{p.sha256}" for p in packages)
    text = "\n".join([IMAGE_LAYOUT, base.name, *debs])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def assemble_image(
    base: Path,
    layers: Sequence[tuple[str, bytes]],
    host_libraries: Iterable[Path],
    dest: Path,
) -> Path:
    """Build the image at ``dest`` (which must not exist) from ``base`` and the checked tars in
    ``layers`` (package name, tar bytes); ``host_libraries`` are absolute host paths copied to the
    same path in the image unless it already has one."""
    if os.path.lexists(dest):
        raise SandboxError(f"building image {dest.name}: already exists")
    staging: Path | None = None
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
        _link_tree(base, staging)
        written: list[str] = []
        for name, tar in layers:
            try:
                written += extract_layer(tar, staging, base)
            except SandboxError as exc:
                raise SandboxError(f"package {name}: {exc}") from None
        for library in host_libraries:
            _copy_host_library(library, staging)
        _write_programs(staging, written)
        _seal_dirs(staging)
        staging.rename(dest)
        staging = None
        _fsync_dir(dest.parent)
    except OSError as exc:
        raise SandboxError(f"building image {dest.name}: {exc}") from exc
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return dest


def programs(written: Iterable[str], root: Path) -> dict[str, str]:
    """Name -> absolute path of every executable regular file the layers put in a program
    directory (the first by path wins a name)."""
    found: dict[str, str] = {}
    for rel in sorted(set(written)):
        parent, _, name = rel.rpartition("/")
        if parent not in PROGRAM_DIRS or not name:
            continue
        info = (root / rel).lstat()
        if stat.S_ISREG(info.st_mode) and info.st_mode & 0o111:
            found.setdefault(name, f"/{rel}")
    return found


def _write_programs(staging: Path, written: list[str]) -> None:
    target = staging / PROGRAMS_FILE
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    body = json.dumps({"programs": programs(written, staging)}, indent=1, sort_keys=True)
    fd, tmp = tempfile.mkstemp(dir=staging)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(body + "\n")
        _copy_file(Path(tmp), target, FILE_MODE)
    finally:
        os.unlink(tmp)


def _link_tree(base: Path, staging: Path) -> None:
    """Recreate ``base`` under ``staging``: directories made, files hard-linked (copied if the
    filesystem refuses a link), symlinks re-made. The base is never opened for writing."""
    for dirpath, dirnames, filenames in os.walk(base):
        here = Path(dirpath)
        target_dir = staging / here.relative_to(base)
        target_dir.mkdir(mode=0o755, exist_ok=True)
        for name in sorted(dirnames + filenames):
            source, target = here / name, target_dir / name
            info = source.lstat()
            if stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(source), target)
                os.lchown(target, 0, 0)
                if name in dirnames:
                    dirnames.remove(name)
            elif stat.S_ISREG(info.st_mode):
                try:
                    os.link(source, target, follow_symlinks=False)
                except OSError:
                    mode = EXEC_MODE if info.st_mode & 0o111 else FILE_MODE
                    _copy_file(source, target, mode)
            elif not stat.S_ISDIR(info.st_mode):
                raise SandboxError(f"base image {base}: {source} is not a file or directory")


def _copy_host_library(library: Path, staging: Path) -> None:
    if not library.is_absolute() or ".." in library.parts:
        raise SandboxError(f"host library {library}: expected an absolute path")
    target = staging / library.relative_to("/")
    if os.path.lexists(target):
        return
    parent = target.parent
    parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    if not parent.resolve().is_relative_to(staging.resolve()):
        raise SandboxError(f"host library {library}: its directory leaves the image")
    real = library.resolve()
    if not real.is_file():
        return
    _copy_file(real, target, EXEC_MODE if real.stat().st_mode & 0o111 else FILE_MODE)
