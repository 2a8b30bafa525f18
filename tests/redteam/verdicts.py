"""Judging attacks whose outcome takes more than the probe's ``ok`` to read (pure; the red-team
tests run the attacks and call these).

Exhaustion (test_attack_exhaustion.py) ends one of three ways: the probe reports its numbers
(``runsc exec`` exited 0), the probe reports a failure of its own, or ``runsc exec`` fails (the
box may have died under it). Containment needs proof both ways: numbers that show the attack
happened (a lower bound) and that a limit stopped it (an upper bound); or a box that is no
longer running, with the kernel's word that its own unit's limit ended it (an OOM kill in the
unit's memory cgroup, or a fork its pids cgroup refused). A failed exec with the box still
running means the attack never ran, and a box that ended with no such evidence could have ended
for any reason: both are errors, never "contained" (docs/threat-model.md §6: a probe bug reports
an error). Setid files (test_attack_queues.py): the host's file must be there to be judged (a
failed stat is no mode 0), and whether the bits ever showed in the box is said.
"""

from __future__ import annotations

import errno
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

RUNNING = "running"
FAILED = "failed"
Outcome = Mapping[str, Any]


@dataclass(frozen=True)
class Fate:
    """What became of the attacked box: its session's state afterwards, the daemon's reason if
    it failed, and what the kernel logged about its unit's cgroups."""

    state: str
    error: str | None = None
    oom: bool = False  # the kernel's OOM killer acted on the unit's memory cgroup
    pids_refused: bool = False  # the pids controller refused a fork in the unit's cgroup

    @property
    def running(self) -> bool:
        return self.state == RUNNING

    @property
    def died_in_unit(self) -> bool:
        """Failed, and the kernel says the unit's own limit was hit."""
        return self.state == FAILED and (self.oom or self.pids_refused)

    def describe(self) -> str:
        if self.running:
            return "the box is still running"
        return (
            f"the box ended ({self.state}: {self.error!r}); kernel: OOM kill in its memory "
            f"cgroup {self.oom}, fork refused by its pids cgroup {self.pids_refused}"
        )


def kernel_evidence(dmesg: str, unit: str) -> tuple[bool, bool]:
    """(OOM kill, fork refused) for ``unit`` in the kernel log: ``oom-kill:...oom_memcg=
    /.../UNIT,...`` and ``cgroup: fork rejected by pids controller in /.../UNIT``."""
    oom_line = re.compile(r"\boom-kill:.*\boom_memcg=\S*/" + re.escape(unit) + ",")
    pids_line = re.compile(r"fork rejected by pids controller in \S*/" + re.escape(unit) + "$")
    lines = dmesg.splitlines()
    return (
        any(oom_line.search(line) for line in lines),
        any(pids_line.search(line.rstrip()) for line in lines),
    )


@dataclass(frozen=True)
class Verdict:
    contained: bool
    error: bool
    why: str


class Bounds(NamedTuple):
    """What the attack's numbers show: that it happened, and that a limit stopped it."""

    ran: bool
    bounded: bool
    why: str


def judge(
    outcome: Outcome, fate: Fate, bounds: Callable[[Outcome], Bounds], *, may_die: bool
) -> Verdict:
    """The verdict on one attack: ``outcome`` is the probe's numbers, ``{"exec": TEXT}`` if
    ``runsc exec`` failed or ``{"probe": WHAT}`` if the probe reported a failure; ``may_die``:
    the box may end under this attack, if its own unit's limit ends it."""
    if "probe" in outcome:
        return Verdict(False, True, f"the probe failed: {outcome['probe']}")
    if "exec" in outcome:
        said = f"runsc exec failed ({str(outcome['exec'])[-80:]!r})"
        if fate.running:
            return Verdict(False, True, f"{said} and the box still runs: the attack never ran")
        if may_die and fate.died_in_unit:
            return Verdict(True, False, f"{said}: {fate.describe()}")
        return Verdict(False, True, f"{said}; {fate.describe()}: not shown to be its unit's limit")
    check = bounds(outcome)
    if not check.ran:
        return Verdict(False, True, f"the attack did not happen: {check.why}")
    if not (fate.running or (may_die and fate.died_in_unit)):
        return Verdict(False, True, f"{check.why}; but {fate.describe()}")
    return Verdict(check.bounded, False, f"{check.why}; {fate.describe()}")


def cpu_bounds(
    detail: Outcome, host: float | None, *, spin_seconds: float, quota_cores: float, wall: float,
    cores: int,
) -> Bounds:  # fmt: skip
    """The spin lasted its time and the unit's processes got at least half of what the quota
    (or the machine, if it has fewer cores) gives in that time: no more than the quota over the
    whole attack, with scheduling slack. ``host``: CPU seconds the host counted for the unit."""
    floor = min(quota_cores, cores) * spin_seconds / 2
    allowed = quota_cores * wall * 1.15 + 1.0
    spun = float(detail.get("wall_seconds", 0))
    inside = float(detail.get("cpu_seconds", 0))
    if host is None:
        return Bounds(False, False, "the unit's CPU time could not be read on the host")
    why = (
        f"the unit's processes used {host:.1f} CPU-s in {wall:.1f} s (gVisor counted "
        f"{inside:.1f}; the spin lasted {spun:.1f} s): at least {floor:.1f} shows the spin, "
        f"the quota allows {allowed:.1f}"
    )
    return Bounds(spun >= spin_seconds and host >= floor, host <= allowed, why)


def fork_bounds(detail: Outcome, fork_max: int) -> Bounds:
    """Some forks worked, and one was refused before ``fork_max``."""
    forked, error = int(detail.get("forked", 0)), detail.get("errno")
    why = f"forked {forked}, then errno {error}"
    return Bounds(forked > 0, error is not None and forked < fork_max, why)


def disk_bounds(detail: Outcome, workspace_bytes: int) -> Bounds:
    """Bytes were written, until ENOSPC within the workspace's size."""
    written, error = int(detail.get("bytes", 0)), detail.get("errno")
    why = f"wrote {written} bytes, then errno {error} (workspace {workspace_bytes} bytes)"
    return Bounds(written > 0, error == errno.ENOSPC and written <= workspace_bytes, why)


def inode_bounds(detail: Outcome, files_max: int) -> Bounds:
    """Files were made, until ENOSPC or the probe's own cap."""
    files, error = int(detail.get("files", 0)), detail.get("errno")
    why = f"made {files} files, then errno {error} (the probe stops at {files_max})"
    return Bounds(files > 0, error == errno.ENOSPC or files == files_max, why)


def balloon_bounds(detail: Outcome, balloon_mib: int) -> Bounds:
    """Memory was touched, and the balloon was stopped before ``balloon_mib``."""
    mib = int(detail.get("mib", 0))
    why = f"touched {mib} MiB of {balloon_mib} (MemoryError: {detail.get('memory_error')})"
    return Bounds(mib > 0, mib < balloon_mib, why)


def flood_bounds(
    detail: Outcome, *, lines_sent: int, journal: int, refusals: int, journal_max: int
) -> Bounds:
    """Every line was sent, or the daemon stopped taking them (``paced``: it reads a session's
    control lines at its call rate, the rest waiting in the socket), and it saw them (it logged
    a refusal of at least one), and wrote at most ``journal_max`` lines about the session."""
    paced = detail.get("paced") is True
    why = (
        f"sent {detail.get('lines')} lines of {lines_sent}"
        f"{' before the daemon stopped taking them (paced)' if paced else ''}; the daemon's "
        f"journal lines about the session: {journal} (at most {journal_max}), {refusals} of them "
        "refusals"
    )
    taken = detail.get("lines") == lines_sent or paced
    return Bounds(taken and refusals > 0, journal <= journal_max, why)


def setid_verdict(inside: Mapping[str, object], host_stat: str) -> tuple[bool, bool, str]:
    """(contained, error, why) of the setid attack from the probe's outcome (each way it tried,
    with the mode the box saw after it or the errno it met) and the host's ``stat -c '%a %F'``
    of the file. Contained only if the box made the file and the host's copy exists, is a
    regular file and has neither setid bit; a file the host cannot stat (a failed stat is no
    mode 0) or an attack that failed in the box proves nothing (error). ``why`` says whether the
    bits ever showed in the box."""
    if inside.get("ok") is not True:
        return False, True, f"the attack failed in the box: {dict(inside)}"
    try:
        seen = json.loads(str(inside["detail"]))
        steps = {how: str(seen[how]) for how in ("created", "fchmod", "chmod", "mode_inside")}
        modes = {how: int(v, 8) for how, v in steps.items() if v.startswith("0o")}
        modes["mode_inside"] = int(steps["mode_inside"], 8)
    except (KeyError, TypeError, ValueError) as exc:
        return False, True, f"no modes from the box ({exc!r}): {dict(inside)}"
    words = host_stat.split(maxsplit=1)
    if len(words) != 2 or not re.fullmatch(r"[0-7]{3,4}", words[0]):
        return False, True, f"the host could not stat the file: {host_stat.strip()[:120]!r}"
    if words[1].strip() not in ("regular file", "regular empty file"):
        return False, True, f"the host's file is a {words[1].strip()!r}, not a regular file"
    mode = int(words[0], 8)
    landed = any(m & 0o6000 for m in modes.values())
    shown = ", ".join(f"{how} {v}" for how, v in steps.items())
    why = (
        f"in the box: {shown} ("
        + ("the bits were set there" if landed else "the box never showed a setid bit")
        + f"); on the host: {oct(mode)}"
    )
    return not mode & 0o6000, False, why
