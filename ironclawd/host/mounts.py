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
    socket = find_socket(real)
    if socket is not None:
        raise PolicyDenied(
            f"mount source {source}: holds the Unix socket {socket}; a sandbox may connect to "
            "host sockets on its mounts (its own control socket is one), so a directory that "
            "holds a socket is never granted"
        )
    return real


# How many entries a granted directory may hold: every one is looked at when the grant is
# submitted and at every session start (20,000 took 10 ms here with the tree in the page cache,
# so the most ~0.1 s; a cold disk takes longer).
MAX_GRANT_ENTRIES = 200_000


def find_socket(root: str, limit: int = MAX_GRANT_ENTRIES) -> str | None:
    """The path of a Unix socket in the tree at ``root`` (symlinks not followed), or None;
    PolicyDenied if the tree holds more than ``limit`` entries or a directory in it cannot be
    read. Sandboxes run with runsc's ``--host-uds=open``: the agent reaches its own control
    socket that way, and the same lets it connect to any host socket on any of its mounts, a
    read-only grant included, whose mode lets its uid write it. A service's socket in a granted
    directory would be a way out past the model proxy and the egress broker. Checked when a
    grant is submitted and at every start; a socket made in a granted directory while a session
    runs is beyond this (docs/threat-model.md)."""
    pending = [root]
    seen = 0
    while pending:
        top = pending.pop()
        try:
            entries = list(os.scandir(top))
        except FileNotFoundError:
            continue  # removed meanwhile: nothing to connect to there
        except OSError as exc:
            raise PolicyDenied(
                f"mount source {root}: cannot look for sockets in {top}: {exc.strerror or exc}"
            ) from None
        seen += len(entries)
        if seen > limit:
            raise PolicyDenied(
                f"mount source {root}: holds more than {limit} entries, too many to check for "
                "Unix sockets at every start; grant a smaller directory"
            )
        for entry in entries:
            # d_type answers without a stat for directories, files and symlinks: only other
            # kinds (sockets, FIFOs, devices; or a file system that gives no type) are stat'ed.
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
            elif entry.is_file(follow_symlinks=False) or entry.is_symlink():
                continue
            else:
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except FileNotFoundError:
                    continue
                if stat.S_ISSOCK(mode):
                    return entry.path
    return None


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
