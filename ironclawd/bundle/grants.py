"""Granted mounts (pure): an agent's host directories at /mnt/<name> on its session's frame, and
which granted mounts ``bundle.spec.check_spec`` accepts (there, and its skill set at /skills)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ironclawd import paths
from ironclawd.bundle.skills import SKILLS_DIR, skills_grant_problem
from ironclawd.domain.agents import MOUNT_NAME_RE, AgentMount
from ironclawd.domain.policy import Mount

# Granted host directories appear at /mnt/<name>. The shared rootfs has only an empty /mnt; a
# per-session host directory holding one empty <name>/ per grant (the "frame") is bound read-only
# over it first, so the mountpoints runsc looks for (and would create) are in the frame, never in
# the shared rootfs (seen with runsc 20221219: a tmpfs at /mnt does not help, its gofer still
# created /mnt/<name> in the host rootfs).
GRANTS_DIR = "/mnt"
FRAMES_DIR = paths.STATE_DIR / "mount-frames"
# Host paths a grant may never name, whatever the operator's allowlist says.
NEVER_GRANTED = (
    str(paths.STATE_DIR),
    str(paths.RUN_DIR),
    str(paths.CONFIG_DIR),
    "/proc",
    "/sys",
    "/dev",
    # Where services keep their sockets (D-Bus, systemd, users' sessions): sandboxes may
    # connect to host sockets on their mounts (``host.mounts.find_socket``).
    "/run",
    "/var/run",
)


def frame_dir(sid: str, state_dir: Path = paths.STATE_DIR) -> Path:
    """A session's mount frame under ``daemon.state_dir``."""
    return state_dir / FRAMES_DIR.name / sid


def granted_mounts(
    sid: str, grants: Sequence[AgentMount], state_dir: Path = paths.STATE_DIR
) -> tuple[Mount, ...]:
    """The mounts for an agent's granted directories: the session's frame at /mnt, then one
    bind per grant at /mnt/<name> (order matters: the frame must be there first)."""
    if not grants:
        return ()
    frame = Mount(GRANTS_DIR, str(frame_dir(sid, state_dir)))
    binds = tuple(Mount(f"{GRANTS_DIR}/{g.name}", g.source, read_only=g.read_only) for g in grants)
    return (frame, *binds)


def grant_refusal(mount: Mount, sid: str, state_dir: Path) -> tuple[str, str] | None:
    """Why ``check_spec`` refuses a granted mount the caller vouches for, as (rule, detail), or
    None. Accepted: the skill set at /skills (``bundle.skills``), /mnt (this session's frame,
    read-only) and binds of a host directory at /mnt/<name> that is none of the daemon's own
    places."""
    if mount.destination == SKILLS_DIR:
        problem = skills_grant_problem(mount, state_dir)
        return ("mount-skills", problem) if problem else None
    where = f"granted mount {mount.destination}"
    if mount.destination == GRANTS_DIR:
        frame = ("bind", str(frame_dir(sid, state_dir)), True)
        if (mount.type, mount.source, mount.read_only) != frame:
            return ("mount-granted", f"{where}: expected this session's read-only frame")
        return None
    parent, _, name = mount.destination.rpartition("/")
    if parent != GRANTS_DIR or MOUNT_NAME_RE.fullmatch(name) is None or mount.type != "bind":
        return ("mount-granted", f"{where}: expected a bind at {GRANTS_DIR}/<name>")
    source = mount.source
    if source == "/" or any(
        source == p or source.startswith(p + "/") or p.startswith(source + "/")
        for p in (*NEVER_GRANTED, str(state_dir))
    ):
        return ("mount-granted", f"{where}: source {source} is never granted")
    return None
