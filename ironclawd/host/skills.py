"""An agent's installed skills on the host: written once per distinct set, never changed after.

A skill set lives at ``<root>/<digest>/<name>/<path>`` (``root`` is ``<state_dir>/skills``), where
``digest`` is the SHA-256 of the canonical list of the set's skills and files (name, path, hash
of each file). It is built in a sibling temp directory and renamed into place, so a set directory
that exists is complete: later sessions reuse it after checking every file's hash again. Files
are root-owned 0644 and directories 0755 (the agent, uid 10000 inside, reads them through runsc's
gofer, which does not translate ids); the sandbox binds the set read-only at ``/skills``.

A set no session uses is removed at daemon start (``collect_skill_sets``): a set is in use while
some bundle on disk names it as a mount source, so sets of sessions a restarted daemon adopts
stay, and the sets of sessions stopped since the daemon started wait for its next start.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import posixpath
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ironclawd.domain.skills import SKILL_NAME_RE, AgentSkill
from ironclawd.errors import SandboxError

log = logging.getLogger("ironclawd.skills")

DIR_MODE = 0o755
FILE_MODE = 0o644
ROOT_MODE = 0o700  # only root (the daemon and runsc's gofer) walks the set directories


def skill_set_digest(skills: Sequence[AgentSkill]) -> str:
    """SHA-256 (hex) of the canonical set: skills by name, each file's path and hash by path."""
    canonical = sorted(
        [skill.name, sorted([f.path, f.sha256] for f in skill.files)] for skill in skills
    )
    text = json.dumps(canonical, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def materialise_skill_set(skills: Sequence[AgentSkill], root: Path) -> Path:
    """The directory of ``skills`` under ``root``, written if absent; SandboxError if a file's
    bytes do not match its hash, a name or path is unsafe, or a reused set was altered."""
    digest = skill_set_digest(skills)
    dest = root / digest
    doing = f"writing skill set {dest}"
    files = _checked_files(skills, doing)
    try:
        root.mkdir(mode=ROOT_MODE, parents=True, exist_ok=True)
        if not dest.is_dir():
            _build(dest, files)
        _verify(dest, files)
    except OSError as exc:
        raise SandboxError(f"{doing}: {exc.strerror or exc}") from exc
    return dest


def collect_skill_sets(root: Path, bundles_dir: Path) -> list[str]:
    """Remove every entry of ``root`` that no bundle under ``bundles_dir`` names as a mount
    source (leftover temp directories included); return the names removed. A bundle that cannot
    be read keeps every set (it might be the one in use)."""
    if not root.is_dir() or not os.listdir(root):
        return []  # nothing to remove: no bundle is read (~0.1 ms a session, of every start)
    keep: set[str] = set()
    for bundle in sorted(bundles_dir.iterdir()) if bundles_dir.is_dir() else []:
        try:
            spec = json.loads((bundle / "config.json").read_text())
            sources = [str(m.get("source", "")) for m in spec.get("mounts", [])]
        except FileNotFoundError:
            continue
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            log.warning("skill sets: keeping all, bundle %s unreadable: %s", bundle, exc)
            return []
        keep.update(Path(s).name for s in sources if Path(s).parent == root)
    removed = []
    for entry in sorted(os.listdir(root)):
        if entry in keep:
            continue
        try:
            shutil.rmtree(root / entry)
        except OSError as exc:  # the daemon starts anyway; the next start tries again
            log.warning("skill sets: could not remove %s: %s", root / entry, exc)
        else:
            removed.append(entry)
    return removed


def _checked_files(skills: Sequence[AgentSkill], doing: str) -> dict[str, bytes]:
    """``name/path`` -> bytes for every file, each checked against its recorded hash."""
    files: dict[str, bytes] = {}
    names = [skill.name for skill in skills]
    if len(set(names)) != len(names):
        raise SandboxError(f"{doing}: a skill name appears twice")
    for skill in skills:
        if not isinstance(skill.name, str) or SKILL_NAME_RE.fullmatch(skill.name) is None:
            raise SandboxError(f"{doing}: skill name {skill.name!r} is not a valid name")
        for item in skill.files:
            where = f"{doing}: skill {skill.name}: file {item.path!r}"
            if not _safe_relative(item.path):
                raise SandboxError(f"{where}: expected a normalised relative path")
            data = item.text.encode("utf-8")
            if hashlib.sha256(data).hexdigest() != item.sha256:
                raise SandboxError(f"{where}: content does not match its SHA-256 {item.sha256}")
            files[f"{skill.name}/{item.path}"] = data
    for path in files:
        # A file may not also be a directory of another ("a" and "a/b").
        if any(other.startswith(path + "/") for other in files):
            raise SandboxError(f"{doing}: {path} is both a file and a directory")
    return files


def _safe_relative(path: str) -> bool:
    if not isinstance(path, str) or not path or "\0" in path or "\\" in path:
        return False
    parts = path.split("/")
    return (
        posixpath.normpath(path) == path
        and not path.startswith("/")
        and not any(part in ("", ".", "..") for part in parts)
    )


def _build(dest: Path, files: dict[str, bytes]) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        for relative, data in sorted(files.items()):
            target = staging / relative
            target.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            _write(target, data)
        for directory, _dirs, _files in os.walk(staging, topdown=False):
            _own(directory)
            os.chmod(directory, DIR_MODE)
            _fsync_dir(directory)
        try:
            staging.rename(dest)
        except OSError:
            if not dest.is_dir():  # another session of the agent renamed the same set first
                raise
        else:
            _fsync_dir(str(dest.parent))
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(staging)


def _write(target: Path, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(target, flags, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        _own(fd)
        os.fchmod(fd, FILE_MODE)
        os.fsync(fd)
    finally:
        os.close(fd)


def _verify(dest: Path, files: dict[str, bytes]) -> None:
    """Every expected file, and nothing else, with its bytes: a set is immutable once made."""
    found = set()
    for directory, _dirs, names in os.walk(dest):
        for name in names:
            found.add(str(Path(directory, name).relative_to(dest)))
    if found != set(files):
        raise SandboxError(f"skill set {dest}: files differ from the set (altered on disk?)")
    for relative, data in files.items():
        fd = os.open(dest / relative, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with open(fd, "rb") as reader:
            if reader.read(len(data) + 1) != data:
                raise SandboxError(f"skill set {dest}: {relative} altered on disk")


def _own(target: int | str) -> None:
    # The daemon runs as root; unit tests may not, and then the files stay theirs.
    if os.geteuid() == 0:
        if isinstance(target, int):
            os.fchown(target, 0, 0)
        else:
            os.lchown(target, 0, 0)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
