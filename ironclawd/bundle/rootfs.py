"""Assemble the agent's read-only rootfs (docs/architecture.md §3 "Rootfs").

The rootfs holds exactly: the frozen agent at ``/app/agent`` (PyInstaller --onedir output), the
template files from ``oci-bundles/agent/`` (passwd, group, nsswitch.conf), the host shared
libraries the frozen binaries load from outside their own directory (glibc, the bootloader's libz),
and empty directories for the mounts the spec adds. No shell, no interpreter executable, no
``.py`` source. Everything is owned by root, directories are 0555, files 0444 (0555 if
executable), nothing is setuid/setgid. It is built in a sibling temp directory and renamed into
place, so ``dest`` appears whole or not at all.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ironclawd.errors import SandboxError

APP_DIR = Path("app/agent")
AGENT_EXECUTABLE = "agent"
# Mount targets must exist in a read-only root: runsc cannot create them there. "skills" is
# where an agent's skill set is bound (ironclawd/bundle/skills.py); empty for agents without.
MOUNTPOINTS: tuple[str, ...] = (
    "proc", "dev", "tmp", "run/ironclaw", "workspace", "queue/inbound", "queue/outbound", "mnt",
    "skills",
)  # fmt: skip
# Single-file bind mounts need a file, not a directory, to land on (the session key).
FILE_MOUNTPOINTS: tuple[str, ...] = ("run/ironclaw-key",)
# PyInstaller's bootloader re-executes itself with LD_LIBRARY_PATH pointing here; everything it
# loads after that (libpython, extension modules) resolves against this directory first.
PYINSTALLER_LIBDIR = "_internal"

DIR_MODE = 0o555
FILE_MODE = 0o444
EXEC_MODE = 0o555
ROOT_UID = ROOT_GID = 0
_ELF_MAGIC = b"\x7fELF"


def assemble_rootfs(
    frozen_dir: Path,
    template_dir: Path,
    dest: Path,
    *,
    mountpoints: Iterable[str] = MOUNTPOINTS,
) -> Path:
    """Build the read-only agent rootfs at ``dest`` (which must not exist) and return it."""
    if not (frozen_dir / AGENT_EXECUTABLE).is_file():
        raise SandboxError(f"assembling rootfs {dest}: no {AGENT_EXECUTABLE} in {frozen_dir}")
    if not template_dir.is_dir():
        raise SandboxError(f"assembling rootfs {dest}: template {template_dir} is not a directory")
    if os.path.lexists(dest):
        raise SandboxError(f"assembling rootfs {dest}: already exists")
    staging: Path | None = None
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
        _copy_tree(template_dir, staging, allow_exec=False, allow_symlinks=False)
        _copy_tree(frozen_dir, staging / APP_DIR, allow_exec=True, allow_symlinks=True)
        for library in host_libraries(frozen_dir):
            target = staging / library.relative_to("/")
            _make_dirs(target.parent, staging)
            _copy_file(library, target, EXEC_MODE if _is_executable(library) else FILE_MODE)
        for mountpoint in mountpoints:
            _make_dirs(staging / _relative(mountpoint), staging)
        for mountpoint in FILE_MOUNTPOINTS:
            target = staging / _relative(mountpoint)
            _make_dirs(target.parent, staging)
            target.touch(mode=FILE_MODE)
        _seal_dirs(staging)
        # rename(2) onto an existing *empty* directory succeeds; the check above covers that
        # case except for a race with another assembler, which the caller's lock excludes.
        staging.rename(dest)
        staging = None
        _fsync_dir(dest.parent)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxError(f"assembling rootfs {dest}: {exc}") from exc
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return dest


def host_libraries(frozen_dir: Path) -> list[Path]:
    """Host shared libraries (and the ELF interpreter) the frozen tree loads from outside itself.

    Asks ``ldd`` (glibc's: it lists, it does not run the program). Entry executables at the top
    of the tree are started by the kernel with no LD_LIBRARY_PATH; everything below is loaded
    after PyInstaller's bootloader has set it to ``_internal``, so resolve those the same way.
    """
    frozen_dir = frozen_dir.resolve()
    libdir = frozen_dir / PYINSTALLER_LIBDIR
    found: set[Path] = set()
    for path in sorted(frozen_dir.rglob("*")):
        if path.is_symlink() or not path.is_file() or not _is_elf(path):
            continue
        at_top = path.parent == frozen_dir
        for library in _ldd(path, None if at_top else libdir):
            if not library.is_relative_to(frozen_dir):
                found.add(library)
    return sorted(found)


def _ldd(path: Path, library_path: Path | None) -> list[Path]:
    ldd = shutil.which("ldd")
    if ldd is None:
        raise SandboxError("listing shared libraries: ldd not found (package libc-bin)")
    env = {"PATH": os.defpath, "LC_ALL": "C"}
    if library_path is not None:
        env["LD_LIBRARY_PATH"] = str(library_path)
    result = subprocess.run([ldd, str(path)], capture_output=True, text=True, env=env, check=False)
    if "not a dynamic executable" in result.stdout + result.stderr:
        return []
    if result.returncode != 0:
        raise SandboxError(f"listing shared libraries of {path}: {result.stderr.strip()}")
    libraries = []
    for line in result.stdout.splitlines():
        # "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)", "/lib64/ld-linux-x86-64.so.2
        # (0x...)", "linux-vdso.so.1 (0x...)" (in the kernel, no file) or "libfoo.so => not found".
        name, arrow, resolved = line.strip().partition(" => ")
        if "not found" in resolved:
            raise SandboxError(f"listing shared libraries of {path}: {name} not found")
        candidate = resolved if arrow else name
        candidate = candidate.split(" (", 1)[0].strip()
        if candidate.startswith("/"):
            libraries.append(Path(candidate))
    return libraries


def _copy_tree(src: Path, dst: Path, *, allow_exec: bool, allow_symlinks: bool) -> None:
    """Copy ``src`` into ``dst`` (created if absent), refusing anything but files and dirs."""
    _make_dirs(dst, dst)
    for dirpath, dirnames, filenames in os.walk(src):
        here = Path(dirpath)
        target_dir = dst / here.relative_to(src)
        for name in sorted(dirnames + filenames):
            source = here / name
            target = target_dir / name
            info = source.lstat()
            if stat.S_ISLNK(info.st_mode):
                if not allow_symlinks:
                    raise SandboxError(f"copying {source}: symlinks are not allowed here")
                _copy_symlink(source, target, src)
                if name in dirnames:
                    dirnames.remove(name)  # os.walk would not descend anyway; be explicit
            elif stat.S_ISDIR(info.st_mode):
                _make_dirs(target, dst)
            elif stat.S_ISREG(info.st_mode):
                executable = allow_exec and bool(info.st_mode & 0o111)
                _copy_file(source, target, EXEC_MODE if executable else FILE_MODE)
            else:
                raise SandboxError(f"copying {source}: not a regular file or directory")


def _copy_symlink(source: Path, target: Path, root: Path) -> None:
    """Recreate a relative symlink whose target stays inside ``root``; refuse any other."""
    link = os.readlink(source)
    resolved = os.path.normpath(os.path.join(source.parent, link))
    if os.path.isabs(link) or not Path(resolved).is_relative_to(root):
        raise SandboxError(f"copying {source}: symlink to {link} leaves {root}")
    os.symlink(link, target)
    os.lchown(target, ROOT_UID, ROOT_GID)


def _copy_file(source: Path, target: Path, mode: int) -> None:
    """Write ``target`` afresh (never through an existing name), root-owned, ``mode``, synced."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(source, "rb") as reader, open(os.open(target, flags, 0o600), "wb") as writer:
        shutil.copyfileobj(reader, writer, 1 << 20)
        writer.flush()
        os.fchown(writer.fileno(), ROOT_UID, ROOT_GID)
        # fchmod after fchown: chown(2) clears setuid/setgid bits, and we set none anyway.
        os.fchmod(writer.fileno(), mode)
        os.fsync(writer.fileno())


def _make_dirs(path: Path, root: Path) -> None:
    """Create ``path`` and missing parents up to ``root``; modes are sealed at the end."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.resolve().is_relative_to(root.resolve()):
        raise SandboxError(f"creating {path}: outside {root}")


def _seal_dirs(root: Path) -> None:
    """Make every directory root-owned 0555 and durable, deepest first."""
    for dirpath, _dirnames, _filenames in os.walk(root, topdown=False):
        os.lchown(dirpath, ROOT_UID, ROOT_GID)
        os.chmod(dirpath, DIR_MODE)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _relative(mountpoint: str) -> Path:
    relative = Path(mountpoint.lstrip("/"))
    if not relative.parts or ".." in relative.parts:
        raise SandboxError(f"mountpoint {mountpoint!r}: expected a path below /")
    return relative


def _is_elf(path: Path) -> bool:
    with open(path, "rb") as file:
        return file.read(4) == _ELF_MAGIC


def _is_executable(path: Path) -> bool:
    return bool(path.stat().st_mode & 0o111)
