"""Where an agent's installed skills appear in its sandbox, and the one mount that puts them there.

The daemon writes an agent's skills to a content-addressed, immutable host directory,
``<state_dir>/skills/<digest>/<name>/<path>`` (ironclawd/host/skills.py), and binds that one
directory at ``/skills``: read-only, nosuid, nodev, noexec. The rootfs has an empty ``/skills``
(runsc must never create a mountpoint, see ironclawd/bundle/spec.py), so an agent without skills
sees an empty read-only directory there. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ironclawd import lazy_re, paths
from ironclawd.domain.policy import Mount

SKILLS_DIR = "/skills"
SKILL_SETS_DIR = paths.STATE_DIR / "skills"
SKILL_SET_RE = lazy_re.compile(r"[0-9a-f]{64}")
# A skill mount is read-only *and* carries every hygiene flag: nothing in it may run, even if a
# future runtime honoured a file's mode bits on a read-only bind.
SKILLS_OPTIONS = ("ro", "nosuid", "nodev", "noexec")


def skill_sets_dir(state_dir: Path = paths.STATE_DIR) -> Path:
    """The directory holding every materialised skill set, under ``daemon.state_dir``."""
    return state_dir / SKILL_SETS_DIR.name


def skills_mount(set_dir: Path) -> Mount:
    """The bind of a materialised skill set at /skills (read-only; hygiene flags are added)."""
    return Mount(SKILLS_DIR, str(set_dir), read_only=True)


def skills_grant_problem(mount: Mount, state_dir: Path) -> str | None:
    """Why ``mount`` is not the vouched-for skills mount (a read-only bind of one skill set
    directory at /skills), or None."""
    where = f"skills mount {mount.destination}"
    source = Path(mount.source)
    if mount.destination != SKILLS_DIR or mount.type != "bind" or not mount.read_only:
        return f"{where}: expected a read-only bind at {SKILLS_DIR}"
    if source.parent != skill_sets_dir(state_dir) or not SKILL_SET_RE.fullmatch(source.name):
        return f"{where}: source {mount.source} is not a skill set in {skill_sets_dir(state_dir)}"
    return None


def skills_spec_problem(
    mount: Mapping[str, Any], expected: tuple[str, str, bool] | None
) -> str | None:
    """Why a spec's /skills mount is not the vouched-for set (``expected``: its type, source and
    read-only-ness, or None if none was vouched for), read-only, nosuid, nodev, noexec; or None."""
    actual = (mount.get("type"), mount.get("source"))
    if expected is None or actual != expected[:2]:
        return f"{actual!r} is not this agent's skill set"
    options = mount.get("options")
    missing = [f for f in SKILLS_OPTIONS if not isinstance(options, list) or f not in options]
    return f"options lack {missing}" if missing else None
