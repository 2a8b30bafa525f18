"""Exhaustion from inside a real session (redteam_probe/probes/exhaust.py): CPU spin, memory
balloon, fork bomb, disk and inode fill of the workspace, and a flood of lines the daemon rejects.
Each must be bounded by the sandbox unit's limits (read from its cgroups on the host), and the
daemon and another session must keep answering while it runs. Each verdict needs proof that the
attack happened, and a box that died needs the kernel's word that its own unit's limit ended it
(tests/redteam/verdicts.py); anything less is an error, never "contained"."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ironclawd.domain.agents import BUILTIN
from tests.harness.private_systemd import SystemdHarness
from tests.redteam.conftest import (
    AGENT,
    PROBE_BINARY,
    RUNNING,
    Sandbox,
    Sessions,
    journal_cursor,
    journal_since,
    module_sessions,
    out,
    record,
)
from tests.redteam.report import Ledger
from tests.redteam.verdicts import (
    Bounds,
    Fate,
    Outcome,
    Verdict,
    balloon_bounds,
    cpu_bounds,
    disk_bounds,
    flood_bounds,
    fork_bounds,
    inode_bounds,
    judge,
    kernel_evidence,
)

pytestmark = pytest.mark.redteam

SPEC = BUILTIN[AGENT]
SPIN_SECONDS = 6
FORK_MAX = 4096
INODES_MAX = 100_000  # the probe's own cap (redteam_probe/probes/exhaust.py)
BALLOON_MIB = 1024
FLOOD_LINES = 20_000
# Journal lines the daemon may write about one flood (rate-limited refusals).
FLOOD_JOURNAL_MAX = 200
# What the daemon logs for each line it rejects (ironclawd/api/control.py), throttled.
FLOOD_REFUSAL = "ignoring control line"


@dataclass
class Arena:
    sysd: SystemdHarness
    sessions: Sessions
    bystander: Sandbox


@pytest.fixture(scope="module")
def arena(daemon: SystemdHarness) -> Iterator[Arena]:
    with module_sessions(daemon) as sessions:
        bystander = sessions.create()
        assert bystander.send("hello").endswith("hello")
        yield Arena(daemon, sessions, bystander)


# CPU time of every host process in a unit (runsc, gofer, sandbox and the ptrace platform's
# stubs that run the box's code), children reaped by them included: proc(5) stat fields 14-17.
CPU_OF_UNIT = r"""
ticks=$(getconf CLK_TCK); total=0
for p in /proc/[0-9]*; do
    grep -qE ":/.*/$1\$" "$p/cgroup" 2>/dev/null || continue
    set -- "$1" $(sed 's/.*) //' "$p/stat" 2>/dev/null)
    [ $# -ge 16 ] && total=$((total + ${13} + ${14} + ${15} + ${16}))
done
echo "$total $ticks"
"""


def cpu_used(sysd: SystemdHarness, box: Sandbox) -> float | None:
    """CPU seconds the unit's processes have used, read from the host's /proc."""
    words = out(sysd.run(["bash", "-c", CPU_OF_UNIT, "cpu", box.unit])).split()
    if len(words) != 2 or not all(w.isdigit() for w in words):
        return None
    return int(words[0]) / int(words[1])


def cpu_throttled(sysd: SystemdHarness, group: str) -> int | None:
    """How many periods the CFS quota throttled the unit's cpu cgroup (v1 cpu.stat), or None."""
    proc = sysd.run(["cat", f"/sys/fs/cgroup/cpu{group}/cpu.stat"])
    found = re.search(r"^nr_throttled (\d+)$", out(proc), re.MULTILINE)
    return int(found.group(1)) if proc.returncode == 0 and found else None


def fate(sysd: SystemdHarness, box: Sandbox, *, exec_failed: bool) -> Fate:
    """What became of the box: its session's state (after a failed ``runsc exec``, given up to
    30 s to leave "running": the daemon sees a dead sandbox only once its unit has ended), the
    daemon's reason, and what the kernel logged about the unit's memory and pids cgroups."""
    deadline = time.monotonic() + (30 if exec_failed else 0)
    while (state := box.state()) == RUNNING and time.monotonic() < deadline:
        time.sleep(0.5)
    if state == RUNNING:
        return Fate(state)
    shown = json.loads(out(sysd.run(["ironctl", "session", "show", box.sid, "--json"])))
    oom, pids = kernel_evidence(out(sysd.run(["dmesg"])), box.unit)
    return Fate(state, shown.get("error"), oom, pids)


def while_attacking(arena: Arena, attack: Callable[[], Any]) -> tuple[Any, str, bool]:
    """Run ``attack`` in a thread; meanwhile the daemon and the bystander must answer."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(attack())
        except BaseException as exc:  # reported below, with what the host saw
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(1.5)
    start = time.monotonic()
    status = arena.sysd.run(["ironctl", "status", "--json"], timeout=60)
    status_s = time.monotonic() - start
    reply = arena.bystander.send("during the attack", timeout=90)
    reply_s = time.monotonic() - start - status_s
    thread.join()
    ok = status.returncode == 0 and reply.endswith("during the attack")
    note = f"meanwhile: ironctl status in {status_s:.1f} s, bystander replied in {reply_s:.1f} s"
    if errors:
        raise errors[0]
    return result[0], note, ok


def _run(box: Sandbox, attack_id: str, **opts: object) -> dict[str, Any]:
    """The attack's numbers; ``{"exec": ...}`` if ``runsc exec`` failed (the box may have died
    under it), ``{"probe": ...}`` if the probe reported a failure or printed no report."""
    user = f"{box.uid}:{box.gid}"
    argv = [f"--probe-opt={k}={v}" for k, v in {"only": attack_id, **opts}.items()]
    proc = box.runsc("exec", "--user", user, box.container, PROBE_BINARY,
                     "--probe-attack=exhaustion", *argv, timeout=300)  # fmt: skip
    if proc.returncode != 0:
        return {"exec": out(proc).strip()[-200:]}
    try:
        raw = json.loads(proc.stdout)["attacks"][attack_id]
        detail = json.loads(raw["detail"]) if raw["ok"] is True else None
    except (ValueError, KeyError, TypeError) as exc:
        return {"probe": f"no report ({exc!r}): {out(proc).strip()[-200:]}"}
    if not isinstance(detail, dict):
        return {"probe": raw}
    return detail


def _daemon_active(arena: Arena) -> bool:
    active = out(arena.sysd.run(["systemctl", "is-active", "ironclawd"])).strip() == "active"
    return active and arena.bystander.state() == RUNNING


def _record(
    arena: Arena, ledger: Ledger, attack_id: str, title: str, verdict: Verdict, host_ok: bool,
    notes: str,
) -> None:  # fmt: skip
    """Record the verdict (the host's side must have held too) and assert it."""
    contained = verdict.contained and host_ok
    record(ledger, attack_id, "exhaustion", title, contained,
           f"{verdict.why}; {notes}; daemon and bystander fine throughout: {host_ok}",
           error=verdict.error)  # fmt: skip
    assert not verdict.error, (verdict.why, notes)
    assert contained, (verdict.why, notes)


def test_cpu_spin_is_held_to_the_units_quota(arena: Arena, ledger: Ledger) -> None:
    box = arena.sessions.create()
    group = out(arena.sysd.run(["systemctl", "show", "-P", "ControlGroup", box.unit])).strip()
    before, throttled = cpu_used(arena.sysd, box), cpu_throttled(arena.sysd, group)
    start = time.monotonic()
    outcome, note, ok = while_attacking(
        arena, lambda: _run(box, "exhaustion.cpu-spin", spin_seconds=SPIN_SECONDS, spinners=4)
    )
    wall = time.monotonic() - start
    after, throttled_after = cpu_used(arena.sysd, box), cpu_throttled(arena.sysd, group)
    host = None if before is None or after is None else after - before
    # gVisor's own rusage counts time its tasks waited for the host too (it reported 14.5 CPU-s
    # in 6.7 s on 2 cores): the host's count of the unit's processes is the measure.
    verdict = judge(
        outcome, fate(arena.sysd, box, exec_failed="exec" in outcome),
        lambda d: cpu_bounds(d, host, spin_seconds=SPIN_SECONDS,
                             quota_cores=SPEC.cpu_percent / 100, wall=wall,
                             cores=os.cpu_count() or 1),
        may_die=False,
    )  # fmt: skip
    periods = (
        "unknown" if throttled is None or throttled_after is None
        else str(throttled_after - throttled)
    )  # fmt: skip
    _record(arena, ledger, "exhaustion.cpu-spin", f"spin 4 processes for {SPIN_SECONDS} s",
            verdict, ok and box.state() == RUNNING,
            f"quota {SPEC.cpu_percent}%, periods throttled {periods}; {note}")  # fmt: skip


def test_fork_bomb_is_bounded(arena: Arena, ledger: Ledger) -> None:
    box = arena.sessions.create()
    # Read before the attack: a unit that died shows systemd's defaults.
    tasks_max = out(arena.sysd.run(["systemctl", "show", "-P", "TasksMax", box.unit])).strip()
    outcome, note, ok = while_attacking(
        arena, lambda: _run(box, "exhaustion.fork-bomb", fork_max=FORK_MAX)
    )
    fated = fate(arena.sysd, box, exec_failed="exec" in outcome)
    verdict = judge(outcome, fated, lambda d: fork_bounds(d, FORK_MAX), may_die=True)
    _record(arena, ledger, "exhaustion.fork-bomb", f"fork until refused ({FORK_MAX} at most)",
            verdict, ok and _daemon_active(arena),
            f"unit TasksMax {tasks_max}; {note}")  # fmt: skip


@pytest.mark.parametrize("attack_id", ["exhaustion.disk-fill", "exhaustion.inode-fill"])
def test_workspace_fill_is_bounded(arena: Arena, ledger: Ledger, attack_id: str) -> None:
    box = arena.sessions.create()
    outcome, note, ok = while_attacking(arena, lambda: _run(box, attack_id))
    bounds: Callable[[Outcome], Bounds]
    if attack_id == "exhaustion.disk-fill":
        bounds = lambda d: disk_bounds(d, SPEC.workspace_bytes)  # noqa: E731
        title = "write the workspace full (256 MiB at most)"
    else:
        bounds = lambda d: inode_bounds(d, INODES_MAX)  # noqa: E731
        title = f"create files in the workspace until refused ({INODES_MAX:,} at most)"
    fated = fate(arena.sysd, box, exec_failed="exec" in outcome)
    verdict = judge(outcome, fated, bounds, may_die=True)
    _record(arena, ledger, attack_id, title, verdict, ok and _daemon_active(arena),
            f"workspace {SPEC.workspace_bytes} bytes, memory {SPEC.memory_bytes >> 20} MiB; "
            f"{note}")  # fmt: skip


def test_log_flood_is_rate_limited(arena: Arena, ledger: Ledger) -> None:
    box = arena.sessions.create()
    mark = journal_cursor(arena.sysd)
    outcome, note, ok = while_attacking(
        arena, lambda: _run(box, "exhaustion.log-flood", flood_lines=FLOOD_LINES)
    )

    def about_box() -> list[str]:
        return [line for line in journal_since(arena.sysd, mark).splitlines() if box.sid in line]

    # The daemon's refusals reach the journal asynchronously: give the first one a moment.
    deadline = time.monotonic() + 10
    lines = about_box()
    while "lines" in outcome and not any(FLOOD_REFUSAL in line for line in lines):
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
        lines = about_box()
    refusals = sum(FLOOD_REFUSAL in line for line in lines)
    verdict = judge(
        outcome, fate(arena.sysd, box, exec_failed="exec" in outcome),
        lambda d: flood_bounds(d, lines_sent=FLOOD_LINES, journal=len(lines), refusals=refusals,
                               journal_max=FLOOD_JOURNAL_MAX),
        may_die=False,
    )  # fmt: skip
    _record(arena, ledger, "exhaustion.log-flood",
            f"{FLOOD_LINES} lines the daemon rejects, on control.sock", verdict,
            ok and box.state() == RUNNING,
            f"first lines: {[line[:80] for line in lines[:2]]}; {note}")  # fmt: skip


def test_memory_balloon_is_killed_at_the_units_limit(arena: Arena, ledger: Ledger) -> None:
    """Last: the balloon takes its own sandbox down (an OOM kill in its unit), nothing else."""
    box = arena.sessions.create()
    outcome, note, ok = while_attacking(
        arena, lambda: _run(box, "exhaustion.memory-balloon", balloon_mib=BALLOON_MIB)
    )
    fated = fate(arena.sysd, box, exec_failed="exec" in outcome)
    verdict = judge(outcome, fated, lambda d: balloon_bounds(d, BALLOON_MIB), may_die=True)
    _record(arena, ledger, "exhaustion.memory-balloon",
            f"touch {BALLOON_MIB} MiB of memory in the box (its unit allows "
            f"{SPEC.memory_bytes >> 20} MiB)", verdict, ok and _daemon_active(arena),
            note)  # fmt: skip
