"""Exhaustion from inside a real session (redteam_probe/probes/exhaust.py): CPU spin, memory
balloon, fork bomb, disk and inode fill of the workspace, and a flood of lines the daemon rejects.
Each must be bounded by the sandbox unit's limits (read from its cgroups on the host), and the
daemon and another session must keep answering while it runs."""

from __future__ import annotations

import json
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

pytestmark = pytest.mark.redteam

SPEC = BUILTIN[AGENT]
FLOOD_LINES = 20_000
# Journal lines the daemon may write about one flood (rate-limited refusals).
FLOOD_JOURNAL_MAX = 200


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


def fate(sysd: SystemdHarness, box: Sandbox) -> tuple[bool, str]:
    """Whether the box is still running, or else died inside its own unit (the kernel's OOM
    killer named the unit's memory cgroup, or runsc's sandbox failed under the unit's limits);
    and what was seen."""
    state = box.state()
    if state == RUNNING:
        return True, "the box is still running"
    shown = json.loads(out(sysd.run(["ironctl", "session", "show", box.sid, "--json"])))
    oom = f"/{box.unit}," in out(sysd.run(["dmesg"]))
    return (
        state == "failed",
        f"the box died in its own unit ({state}: {shown.get('error')!r}; "
        f"kernel OOM kill in its memory cgroup: {oom})",
    )


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
    """The attack's numbers, or ``{"exec": ...}`` if the box died under it."""
    user = f"{box.uid}:{box.gid}"
    argv = [f"--probe-opt={k}={v}" for k, v in {"only": attack_id, **opts}.items()]
    proc = box.runsc("exec", "--user", user, box.container, PROBE_BINARY,
                     "--probe-attack=exhaustion", *argv, timeout=300)  # fmt: skip
    if proc.returncode != 0:
        return {"exec": out(proc).strip()[-200:]}
    raw = json.loads(proc.stdout)["attacks"][attack_id]
    assert raw["ok"] is not None, raw
    detail: dict[str, Any] = json.loads(raw["detail"])
    return detail


def test_cpu_spin_is_held_to_the_units_quota(arena: Arena, ledger: Ledger) -> None:
    box = arena.sessions.create()
    before = cpu_used(arena.sysd, box)
    start = time.monotonic()
    detail, note, ok = while_attacking(
        arena, lambda: _run(box, "exhaustion.cpu-spin", spin_seconds=6, spinners=4)
    )
    wall = time.monotonic() - start
    after = cpu_used(arena.sysd, box)
    host = None if before is None or after is None else after - before
    allowed = SPEC.cpu_percent / 100 * wall * 1.15 + 1.0  # the quota, plus scheduling slack
    # gVisor's own rusage counts time its tasks waited for the host too (it reported 14.5 CPU-s
    # in 6.7 s on 2 cores): the host's count of the unit's processes is the measure.
    inside = float(detail.get("cpu_seconds", 0))
    within = host is not None and 0 < host <= allowed
    contained = within and ok and box.state() == RUNNING
    measured = "not available" if host is None else f"{host:.1f} CPU-s"
    record(ledger, "exhaustion.cpu-spin", "exhaustion", "spin 4 processes for 6 s", contained,
           f"the unit's processes used {measured} (gVisor counted {inside:.1f}) in "
           f"{wall:.1f} s; quota {SPEC.cpu_percent}% allows {allowed:.1f}; {note}")  # fmt: skip
    assert contained, (detail, host, allowed, note)


def test_fork_bomb_is_bounded(arena: Arena, ledger: Ledger) -> None:
    box = arena.sessions.create()
    tasks_max = out(arena.sysd.run(["systemctl", "show", "-P", "TasksMax", box.unit])).strip()
    detail, note, ok = while_attacking(arena, lambda: _run(box, "exhaustion.fork-bomb",
                                                           fork_max=4096))  # fmt: skip
    refused = detail.get("errno") is not None and detail.get("forked", 4096) < 4096
    own_unit, seen = fate(arena.sysd, box)
    contained = (refused or "exec" in detail) and own_unit and ok and _daemon_active(arena)
    record(
        ledger,
        "exhaustion.fork-bomb",
        "exhaustion",
        "fork until refused (4096 at most)",
        contained,
        f"inside: {detail} (unit TasksMax {tasks_max}); {seen}; {note}",
    )
    assert contained, (detail, seen, note)


def _daemon_active(arena: Arena) -> bool:
    active = out(arena.sysd.run(["systemctl", "is-active", "ironclawd"])).strip() == "active"
    return active and arena.bystander.state() == RUNNING


@pytest.mark.parametrize("attack_id", ["exhaustion.disk-fill", "exhaustion.inode-fill"])
def test_workspace_fill_is_bounded(arena: Arena, ledger: Ledger, attack_id: str) -> None:
    box = arena.sessions.create()
    detail, note, ok = while_attacking(arena, lambda: _run(box, attack_id))
    if attack_id == "exhaustion.disk-fill":
        bounded = detail.get("errno") == 28 and detail.get("bytes", 0) <= SPEC.workspace_bytes
        title = "write the workspace full (256 MiB at most)"
    else:
        bounded = detail.get("errno") == 28 or detail.get("files") == 100_000
        title = "create files in the workspace until refused (100,000 at most)"
    own_unit, seen = fate(arena.sysd, box)
    contained = (bounded or "exec" in detail) and own_unit and ok and _daemon_active(arena)
    record(ledger, attack_id, "exhaustion", title, contained,
           f"inside: {detail} (workspace {SPEC.workspace_bytes} bytes, memory "
           f"{SPEC.memory_bytes}); {seen}; {note}")  # fmt: skip
    assert contained, (detail, seen, note)


def test_log_flood_is_rate_limited(arena: Arena, ledger: Ledger) -> None:
    box = arena.sessions.create()
    mark = journal_cursor(arena.sysd)
    detail, note, ok = while_attacking(
        arena, lambda: _run(box, "exhaustion.log-flood", flood_lines=FLOOD_LINES)
    )
    lines = [line for line in journal_since(arena.sysd, mark).splitlines() if box.sid in line]
    contained = len(lines) <= FLOOD_JOURNAL_MAX and ok and box.state() == RUNNING
    record(ledger, "exhaustion.log-flood", "exhaustion",
           f"{FLOOD_LINES} lines the daemon rejects, on control.sock", contained,
           f"inside: {detail}; daemon journal lines about the session: {len(lines)} (at most "
           f"{FLOOD_JOURNAL_MAX}); {note}")  # fmt: skip
    assert contained, (len(lines), lines[:3], note)


def test_memory_balloon_is_killed_at_the_units_limit(arena: Arena, ledger: Ledger) -> None:
    """Last: the balloon takes its own sandbox down (an OOM kill in its unit), nothing else."""
    box = arena.sessions.create()
    detail, note, ok = while_attacking(
        arena, lambda: _run(box, "exhaustion.memory-balloon", balloon_mib=1024)
    )
    own_unit, seen = fate(arena.sysd, box)
    bounded = detail.get("mib", 0) < 1024
    contained = bounded and own_unit and ok and _daemon_active(arena)
    record(ledger, "exhaustion.memory-balloon", "exhaustion",
           f"touch 1 GiB of memory in the box (its unit allows {SPEC.memory_bytes >> 20} MiB)",
           contained, f"inside: {detail}; {seen}; {note}")  # fmt: skip
    assert contained, (detail, seen, note)
