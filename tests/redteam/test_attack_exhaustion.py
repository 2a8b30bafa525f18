"""Exhaustion from inside a real session (agent/probes/exhaust.py): CPU spin, memory balloon,
fork bomb, disk and inode fill of the workspace, and a flood of lines the daemon rejects. Each
must be bounded by the sandbox unit's limits (read from its cgroups on the host), and the
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
    RUNNING,
    Ledger,
    Sandbox,
    Sessions,
    journal_cursor,
    journal_since,
    module_sessions,
    out,
    record,
)

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


def cgroup(sysd: SystemdHarness, box: Sandbox, controller: str, name: str) -> int:
    group = out(sysd.run(["systemctl", "show", "-P", "ControlGroup", box.unit])).strip()
    text = out(sysd.run(["cat", f"/sys/fs/cgroup/{controller}{group}/{name}"])).strip()
    return int(text) if text.lstrip("-").isdigit() else -1


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
    raw = box.attacks("exhaustion", only=attack_id, timeout=300, **opts)[attack_id]
    assert raw["ok"] is not None, raw
    detail: dict[str, Any] = json.loads(raw["detail"])
    return detail


def test_cpu_spin_is_held_to_the_units_quota(arena: Arena, ledger: Ledger) -> None:
    box = arena.sessions.create()
    before = cgroup(arena.sysd, box, "cpu,cpuacct", "cpuacct.usage")
    start = time.monotonic()
    detail, note, ok = while_attacking(
        arena, lambda: _run(box, "exhaustion.cpu-spin", spin_seconds=6, spinners=4)
    )
    wall = time.monotonic() - start
    used = (cgroup(arena.sysd, box, "cpu,cpuacct", "cpuacct.usage") - before) / 1e9
    allowed = SPEC.cpu_percent / 100 * wall * 1.15 + 1.0  # quota, plus scheduling slack
    contained = before >= 0 and used <= allowed and ok and box.state() == RUNNING
    record(ledger, "exhaustion.cpu-spin", "exhaustion", "spin 4 processes for 6 s", contained,
           f"unit used {used:.1f} CPU-s in {wall:.1f} s (quota {SPEC.cpu_percent}% allows "
           f"{allowed:.1f}); inside: {detail}; {note}")  # fmt: skip
    assert contained, (used, allowed, note)


def test_fork_bomb_is_bounded(arena: Arena, ledger: Ledger) -> None:
    box = arena.sessions.create()
    detail, note, ok = while_attacking(arena, lambda: _run(box, "exhaustion.fork-bomb",
                                                           fork_max=4096))  # fmt: skip
    tasks_max = int(out(arena.sysd.run(["systemctl", "show", "-P", "TasksMax", box.unit])))
    bounded = detail["errno"] is not None and detail["forked"] < 4096
    contained = bounded and ok and box.state() == RUNNING
    record(ledger, "exhaustion.fork-bomb", "exhaustion", "fork until refused (4096 at most)",
           contained, f"inside: {detail} (unit TasksMax {tasks_max}, spec pids "
           f"{SPEC.tasks_max}); {note}")  # fmt: skip
    assert contained, (detail, note)


@pytest.mark.parametrize("attack_id", ["exhaustion.disk-fill", "exhaustion.inode-fill"])
def test_workspace_fill_is_bounded(arena: Arena, ledger: Ledger, attack_id: str) -> None:
    box = arena.sessions.create()
    mem_before = cgroup(arena.sysd, box, "memory", "memory.usage_in_bytes")
    detail, note, ok = while_attacking(arena, lambda: _run(box, attack_id))
    if attack_id == "exhaustion.disk-fill":
        bounded = detail["errno"] == 28 and detail["bytes"] <= SPEC.workspace_bytes
        title = "write the workspace full (256 MiB at most)"
    else:
        bounded = detail["errno"] == 28 or detail["files"] == 100_000
        title = "create files in the workspace until refused (100,000 at most)"
    peak = cgroup(arena.sysd, box, "memory", "memory.max_usage_in_bytes")
    within = 0 < peak <= SPEC.memory_bytes
    contained = bounded and within and ok and box.state() == RUNNING
    record(ledger, attack_id, "exhaustion", title, contained,
           f"inside: {detail} (workspace {SPEC.workspace_bytes} bytes); unit memory "
           f"{mem_before}..peak {peak} of {SPEC.memory_bytes}; {note}")  # fmt: skip
    assert contained, (detail, peak, note)


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
    """Last: the balloon takes its sandbox down (an OOM kill of the unit), nothing else."""
    box = arena.sessions.create()
    user = f"{box.uid}:{box.gid}"

    def balloon() -> Any:
        return box.runsc("exec", "--user", user, box.container, "/app/agent/agent", "--probe",
                         "--probe-attack=exhaustion", "--probe-opt=only=exhaustion.memory-balloon",
                         "--probe-opt=balloon_mib=1024", timeout=300)  # fmt: skip

    proc, note, ok = while_attacking(arena, balloon)
    peak = cgroup(arena.sysd, box, "memory", "memory.max_usage_in_bytes")
    limit = cgroup(arena.sysd, box, "memory", "memory.limit_in_bytes")
    got = out(proc)[-300:]
    state = box.state()
    bounded = (0 < peak <= SPEC.memory_bytes) or (
        "memory_error" in got and '"mib": 1024' not in got
    )
    active = out(arena.sysd.run(["systemctl", "is-active", "ironclawd"])).strip() == "active"
    contained = bounded and ok and active and arena.bystander.state() == RUNNING
    record(ledger, "exhaustion.memory-balloon", "exhaustion",
           "touch 1 GiB of memory in the box", contained,
           f"unit memory peak {peak} (limit {limit}, spec {SPEC.memory_bytes}); session now "
           f"{state}; exec: {got.strip()[-160:]!r}; daemon active: {active}; {note}")  # fmt: skip
    assert contained, (peak, got, note)
