"""The atomic bundle writer: puts a checked ``config.json`` into a session's bundle directory.

The directory is made 0700 (docs/architecture.md §3: bundles live under
``/var/lib/ironclaw/bundles/<sid>/``, 0700); the file appears whole or not at all
(docs/style.md §12, ironclawd/atomic.py: temp file, fsync, rename, fsync the directory).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ironclawd import paths
from ironclawd.atomic import atomic_write
from ironclawd.bundle.spec import check_spec, render_spec
from ironclawd.domain.policy import Mount
from ironclawd.errors import HostError

CONFIG_NAME = "config.json"
BUNDLE_DIR_MODE = 0o700
CONFIG_MODE = 0o600


def write_bundle(
    bundle_dir: Path,
    spec: Mapping[str, Any],
    granted: Sequence[Mount] = (),
    state_dir: Path = paths.STATE_DIR,
) -> Path:
    """Check ``spec`` and write it atomically as ``bundle_dir/config.json``; return that path.

    ``bundle_dir`` is created (mode 0700) if missing; its parent must exist. An existing
    config.json is replaced atomically. Raises SandboxError for a refused spec, HostError if the
    directory or file cannot be written (a symlink in place of the directory included).
    """
    check_spec(spec, granted, state_dir)
    data = render_spec(spec).encode()
    try:
        dir_fd = _open_bundle_dir(bundle_dir)
    except OSError as exc:
        raise HostError(f"writing bundle {bundle_dir}: {exc.strerror or exc}") from exc
    try:
        atomic_write(CONFIG_NAME, data, mode=CONFIG_MODE, dir_fd=dir_fd)
    except OSError as exc:
        raise HostError(
            f"writing bundle {bundle_dir}: {CONFIG_NAME}: {exc.strerror or exc}"
        ) from exc
    finally:
        os.close(dir_fd)
    return bundle_dir / CONFIG_NAME


def _open_bundle_dir(bundle_dir: Path) -> int:
    with contextlib.suppress(FileExistsError):
        # mkdir(2) applies the umask; the chmod below fixes the mode either way.
        os.mkdir(bundle_dir, BUNDLE_DIR_MODE)
    # O_NOFOLLOW: a symlink planted in place of the bundle dir must not redirect the write.
    dir_fd = os.open(bundle_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if stat.S_IMODE(os.fstat(dir_fd).st_mode) != BUNDLE_DIR_MODE:
            os.fchmod(dir_fd, BUNDLE_DIR_MODE)
    except OSError:
        os.close(dir_fd)
        raise
    return dir_fd


class BundleDirs:
    """``ports.Bundles``: bundle directories written by ``write_bundle``."""

    def write(
        self, bundle: Path, spec: Mapping[str, Any], granted: Sequence[Mount], state_dir: Path
    ) -> None:
        write_bundle(bundle, spec, granted, state_dir)

    def remove(self, bundle: Path) -> None:
        if bundle.is_symlink():
            bundle.unlink()
        elif bundle.exists():
            shutil.rmtree(bundle)

    def list_names(self, bundles_dir: Path) -> list[str]:
        return os.listdir(bundles_dir) if bundles_dir.is_dir() else []
