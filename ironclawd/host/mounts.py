"""Host directories an agent may be granted (``[gateway] mount_allowlist``): where a requested
source really is, and whether that is a directory under one of the operator's allowlisted
directories. Checked when a ``mounts`` change is submitted and again at every session start, so a
path turned into a symlink (or removed, or moved out) after approval is refused then too."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from ironclawd.domain.skills import AgentSkill
from ironclawd.errors import PolicyDenied
from ironclawd.host.skills import materialise_skill_set

FRAME_MODE = 0o555  # root-owned, read-only to everyone else; bound read-only anyway


def resolve_mount_source(source: str, allowlist: Iterable[str]) -> str:
    """The real path of ``source``: an existing directory strictly below an allowlisted
    directory once every symlink (in ``source`` and in the allowlist) is resolved; else
    PolicyDenied naming why."""
    roots = [os.path.realpath(root) for root in allowlist]
    if not roots:
        raise PolicyDenied(
            f"mount source {source}: no host directory can be granted "
            "([gateway] mount_allowlist is empty)"
        )
    real = os.path.realpath(source, strict=False)
    if real != source:
        raise PolicyDenied(
            f"mount source {source}: resolves to {real} (symlink or '..'); name the real path"
        )
    if not any(real.startswith(root.rstrip("/") + "/") for root in roots):
        raise PolicyDenied(f"mount source {source}: not below [gateway] mount_allowlist")
    try:
        info = os.stat(real, follow_symlinks=False)
    except OSError as exc:
        raise PolicyDenied(f"mount source {source}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise PolicyDenied(f"mount source {source}: not a directory")
    return real


def make_frame(frame: Path, names: Iterable[str]) -> None:
    """Create a session's mount frame afresh: ``frame`` holding one empty directory per grant,
    all root-owned 0555 (bound read-only at /mnt; runsc mounts the grants on its entries)."""
    remove_frame(frame)
    frame.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    frame.mkdir(mode=0o700)
    for name in names:
        (frame / name).mkdir(mode=FRAME_MODE)
    os.chmod(frame, FRAME_MODE)


def remove_frame(frame: Path) -> None:
    """Remove a session's frame (only empty directories: never follows into a mount)."""
    if not os.path.lexists(frame):
        return
    os.chmod(frame, 0o700)
    for entry in os.scandir(frame):
        os.rmdir(entry.path)  # an entry still mounted on, or not empty, fails loudly
    os.rmdir(frame)


class HostMounts:
    """``ports.MountSources`` over this module's functions."""

    def resolve(self, source: str, allowlist: Iterable[str]) -> str:
        return resolve_mount_source(source, allowlist)

    def make_frame(self, frame: Path, names: Iterable[str]) -> None:
        make_frame(frame, names)

    def remove_frame(self, frame: Path) -> None:
        remove_frame(frame)

    def skill_set(self, skills: Sequence[AgentSkill], root: Path) -> Path:
        return materialise_skill_set(skills, root)
