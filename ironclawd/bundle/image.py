"""The agent image: the read-only rootfs every session of an agent shares, assembled once per
distinct (frozen agent, template) content under ``<state_dir>/rootfs/<digest>/``."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from ironclawd.bundle.rootfs import FILE_MOUNTPOINTS, MOUNTPOINTS, assemble_rootfs
from ironclawd.errors import SandboxError
from ironclawd.filecache import IdentityCache, tree_identity

CACHE_KIND = "agent-image-digest"


def content_digest(*roots: Path) -> str:
    """sha256 over the relative paths, modes and bytes of every file under ``roots``."""
    digest = hashlib.sha256()
    for root in roots:
        if not root.is_dir():
            raise SandboxError(f"hashing agent image: {root} is not a directory")
        for directory, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                path = Path(directory, name)
                rel = path.relative_to(root)
                st = path.lstat()
                digest.update(f"{root.name}/{rel}\0{st.st_mode:o}\0".encode())
                if path.is_symlink():
                    digest.update(os.readlink(path).encode())
                else:
                    digest.update(path.read_bytes())
    return digest.hexdigest()


def cached_content_digest(cache: IdentityCache | None, *roots: Path) -> str:
    """``content_digest(*roots)``, taken from ``cache`` while no file under ``roots`` changed
    identity (``filecache.tree_identity``: lstat only, no byte read)."""
    if cache is None:
        return content_digest(*roots)
    try:
        key = tree_identity(roots)
    except OSError as exc:
        raise SandboxError(f"hashing agent image: {exc}") from exc
    cached = cache.get(CACHE_KIND, key)
    if isinstance(cached, str) and len(cached) == 64:
        return cached
    digest = content_digest(*roots)
    cache.put(CACHE_KIND, key, digest)
    return digest


def ensure_rootfs(
    frozen_dir: Path, template_dir: Path, images_dir: Path, cache: IdentityCache | None = None
) -> Path:
    """Return the assembled rootfs for this agent build, assembling it if it is not there.
    ``cache``: where the content digest of an unchanged image is remembered across starts."""
    try:
        # The layout is part of the image: a rootfs assembled before a mountpoint was added must
        # not be reused (runsc would create the missing one inside it).
        layout = hashlib.sha256(repr((MOUNTPOINTS, FILE_MOUNTPOINTS)).encode()).hexdigest()
        content = cached_content_digest(cache, frozen_dir, template_dir)
        digest = hashlib.sha256(f"{content}\0{layout}".encode()).hexdigest()[:24]
        images_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        dest = images_dir / digest
        lock_path = images_dir / ".lock"
        fd = os.open(lock_path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not dest.is_dir():
                assemble_rootfs(frozen_dir, template_dir, dest)
        finally:
            os.close(fd)
    except OSError as exc:
        raise SandboxError(f"preparing agent rootfs from {frozen_dir}: {exc}") from exc
    # images_dir is 0700, but runsc's gofer (root) serves the files: that is enough. The sentry
    # never opens host paths itself.
    return dest
