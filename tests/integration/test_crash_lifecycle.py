"""A crash at any instant never wedges the lifecycle (issue 11): ``kill -9`` of the daemon in the
middle of create, stop, rm, a change's approval and a reload, a client that leaves mid-create, a
fatal start error, a clean stop with connected sandboxes. After every restart the daemon must
reach READY and every session must be settled (running, stopped or failed) with nothing of it
left on the host unless it runs, every change decided or pending (never "approved" without an
outcome), and the audit log must verify.

Randomized tests print their seed; ``IRONCLAW_CRASH_SEED=N`` replays one.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shlex
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.polling import wait_for
from tests.integration.test_sessions import (
    cursor,
    inventory,
    journal_since,
    leftovers,
    list_sessions,
    out,
    remove_all_sessions,
    sh,
    unit_props,
    wait_recovered,
)

pytestmark = pytest.mark.integration

CONFIG = "/etc/ironclaw/ironclawd.toml"
SETTLED = {"running", "stopped", "failed"}


def states_of(sysd: Any) -> dict[str, str]:
    """{sid: state} of every session."""
    return {s["sid"]: s["state"] for s in list_sessions(sysd)}


READY_BOUND = 40.0  # seconds from the kill to READY=1 (TimeoutStartSec is 60)
# Operations interrupted by a kill, in total (IRONCLAW_CRASH_ROUNDS: more for a soak run).
CRASH_ROUNDS = max(51, int(os.environ.get("IRONCLAW_CRASH_ROUNDS", "51")))


def seed() -> int:
    value = int(os.environ.get("IRONCLAW_CRASH_SEED", secrets.randbits(32)))
    print(f"\nseed: IRONCLAW_CRASH_SEED={value}")
    return value


@pytest.fixture
def clean(daemon: Any) -> Iterator[Any]:
    """The daemon running with its default config and no sessions, before and after."""
    sh(daemon, f"rm -f {CONFIG}; systemctl reset-failed ironclawd; true")
    remove_all_sessions(daemon)
    yield daemon
    sh(daemon, f"rm -f {CONFIG}; systemctl reset-failed ironclawd; true")
    remove_all_sessions(daemon)
    stray = {k: v for k, v in inventory(daemon).items() if v and k != "cgroup"}
    assert stray == {}, stray


def create(sysd: Any, sid: str) -> None:
    proc = sysd.run(["ironctl", "session", "create", "--agent", "demo", "--sid", sid])
    assert proc.returncode == 0, out(proc)


def kill_at(sysd: Any, commands: list[str], event: str, delay: float) -> tuple[bool, float]:
    """Start ``commands`` (shell commands) in the background, wait for a journal line
    containing ``event`` (bounded), ``kill -9`` the daemon ``delay`` seconds later, then start it
    again. Whether the event was seen, and the seconds from the kill to READY."""
    background = "\n".join(f"{c} >/dev/null 2>&1 &" for c in commands)
    script = f"""
        c=$(journalctl -n0 --show-cursor --no-pager | sed -n 's/^-- cursor: //p')
        coproc J {{ exec journalctl -f --after-cursor="$c" -o cat --no-pager; }}
        {background}
        timeout 20 grep -m1 -q -F -e {shlex.quote(event)} <&"${{J[0]}}"; seen=$?
        sleep {delay:.3f}
        old=$(systemctl show -P MainPID ironclawd.service)
        systemctl kill -s KILL ironclawd.service
        t0=$(date +%s.%N)
        kill $J_PID
        # Until systemd has seen it die: a "start" before that finds the unit still active.
        timeout 20 bash -c "while [ \\$(systemctl show -P MainPID ironclawd) = $old ]; do
                            sleep 0.02; done"
        # This test kills far more often than systemd's start limit allows (5 starts in 10 s,
        # counting Restart='s own): without a reset, "Start request repeated too quickly"
        # refuses the start below, which is systemd's crash-loop guard working, not a wedge.
        systemctl reset-failed ironclawd.service
        # Type=notify: "start" returns when the restarted daemon said READY=1 (or failed).
        timeout {READY_BOUND} systemctl start ironclawd.service; rc=$?
        t1=$(date +%s.%N)
        wait
        echo "$seen $rc $t0 $t1"
    """
    proc = sh(sysd, script, timeout=READY_BOUND + 60)
    seen, rc, t0, t1 = proc.stdout.decode().split()[-4:]
    state = out(sysd.run(["systemctl", "is-active", "ironclawd.service"])).strip()
    assert rc == "0", (
        f"ironclawd not READY within {READY_BOUND}s of the kill (rc {rc}, {state}):\n"
        + out(sysd.run(["journalctl", "-u", "ironclawd", "-n", "40", "--no-pager", "-o", "cat"]))
    )
    assert state == "active", (
        f"ironclawd not READY within {READY_BOUND}s of the kill (rc {rc}, {state}):\n"
        + out(sysd.run(["journalctl", "-u", "ironclawd", "-n", "40", "--no-pager", "-o", "cat"]))
    )
    return seen == "0", float(t1) - float(t0)


def assert_settled(sysd: Any) -> dict[str, str]:
    """Serving, every session settled, and only running sessions own host resources. READY
    comes before the sessions an earlier run left are adopted (issue 17): once the daemon says
    it recovered them (bounded like READY), nothing may be left unsettled."""
    status = sysd.run(["ironctl", "status"])
    assert status.returncode == 0, out(status)
    wait_recovered(sysd, READY_BOUND)
    states = states_of(sysd)
    stuck = {sid: st for sid, st in states.items() if st not in SETTLED}
    assert stuck == {}, stuck
    running = {sid for sid, st in states.items() if st == "running"}

    def leaked_now() -> dict[str, list[str]]:
        found = inventory(sysd)
        leaked = {
            kind: [e for e in found[kind] if not any(sid in e for sid in running)]
            for kind in ("unit", "netns", "bundle", "socketdir")
        }
        return {kind: entries for kind, entries in leaked.items() if entries}

    # systemd drops a mount unit's record (run-netns-ironclaw\x2d<sid>.mount) when it has
    # processed the unmount and collected the sandbox unit that required it: asynchronously,
    # after the daemon's rm returned (CI of stop 23 saw two such records with /run/netns
    # already empty). Bounded: a resource really left behind stays and fails here.
    wait_for(f"nothing left of settled sessions {states}", leaked_now, lambda v: v == {}, 15)
    return states


# -- the reproduction from the issue ---------------------------------------------------------


def test_kill_while_stopping_never_wedges_start_up(clean: Any) -> None:
    sysd = clean
    rng = random.Random(seed())
    for attempt in range(3):
        sid = f"stopkill{attempt}{secrets.token_hex(3)}"
        create(sysd, sid)
        mark = cursor(sysd)
        # A stop takes about 0.1s, the issue hit it one time in four. Here a unit that is part
        # of the sandbox's and ordered after it takes 2s to stop (SIGCONT does not end it;
        # systemd waits TimeoutStopSec, then SIGKILL), so the sandbox's stop job, and the
        # daemon's "stopping", last that long: every attempt is killed inside the window.
        unit = f"ironclaw-sbx-{sid}.service"
        hold = (
            f"systemd-run -q --unit=stophold-{sid} -p PartOf={unit} -p After={unit} "
            "-p KillSignal=SIGCONT -p TimeoutStopSec=2 -p CollectMode=inactive-or-failed "
            "sleep 600"
        )
        assert sh(sysd, hold).returncode == 0
        delay = rng.uniform(0.0, 1.0)
        seen, took = kill_at(
            sysd, [f"ironctl session stop {sid}"], f"session {sid} stopping", delay
        )
        assert seen, f"session {sid} never logged 'stopping'"
        # Gone with the stop; its references would keep the sandbox's unit loaded.
        sh(sysd, f"systemctl stop stophold-{sid}; systemctl reset-failed stophold-{sid}; true")
        log = journal_since(sysd, mark)
        assert "cannot go from" not in log, log
        states = assert_settled(sysd)
        print(f"killed {delay:.3f}s into stopping: READY {took:.2f}s later, {states[sid]}")
        assert states[sid] == "stopped", states  # the interrupted stop was finished
        proc = sysd.run(["ironctl", "session", "rm", sid])
        assert proc.returncode == 0, out(proc)
        assert leftovers(sysd, sid) == {}


# -- kill -9 at random points of create, stop, rm, approve and reload ------------------------

# Where a kill lands: after the journal line of one of the operations plus a random delay.
# "admin call" lines mark a request's arrival, the session lines its transitions.
CALL = "admin call /ironclaw.admin.v1.AdminService/"
# Many changes from one operator (the default allows 20 an hour); agent_log_lines varies so that
# each reload has something to apply.
RATE = "[gateway]\nsubmissions_per_hour = 1000\n[daemon]\nagent_log_lines = {}\n"
DECIDED = {"pending", "applied", "failed", "rejected"}


def ctl_json(sysd: Any, *args: str) -> Any:
    proc = sysd.run(["ironctl", *args, "--json"])
    assert proc.returncode == 0, (args, out(proc))
    return json.loads(proc.stdout.decode())


def plan(rng: random.Random, states: dict[str, str], change: str) -> tuple[list[str], str]:
    """The operations of one round (shell commands) and the event that times the kill: sessions
    created, stopped and removed, ``change`` approved (a persona change of the agent every
    session runs: approving it restarts them) and the configuration reloaded."""
    running = sorted(sid for sid, st in states.items() if st == "running")
    idle = sorted(sid for sid, st in states.items() if st in {"stopped", "failed"})
    ops: list[tuple[str, list[str]]] = []
    for _ in range(max(0, 3 - len(states))):
        sid = f"crash{secrets.token_hex(4)}"
        events = [f"{CALL}CreateSession", f"session {sid} created", f"session {sid} starting"]
        ops.append((f"ironctl session create --agent demo --sid {sid}", events))
    for sid in rng.sample(running, min(len(running), 2)):
        if rng.random() < 0.5:
            events = [f"{CALL}StopSession", f"session {sid} stopping"]
            ops.append((f"ironctl session stop {sid}", events))
        else:
            events = [f"{CALL}RemoveSession", f"session {sid} stopping", f"session {sid} stopped"]
            ops.append((f"ironctl session rm --force {sid}", events))
    for sid in rng.sample(idle, min(len(idle), 2)):
        ops.append((f"ironctl session rm {sid}", [f"{CALL}RemoveSession"]))
    # Approving restarts the running sessions of the agent (stop, start): the longest stretch of
    # an approval, during which it is "approved" and not yet "applied".
    stopped = {c.rpartition(" ")[2] for c, _ in ops if " stop " in c or " rm " in c}
    restarts = [f"session {sid} stopping" for sid in running if sid not in stopped]
    events = [f"{CALL}ApproveChange", *restarts]
    ops.append((f"ironctl change approve {change} --yes", events))
    reload = f"printf {shlex.quote(RATE.format(rng.randint(1, 9999)))} > {CONFIG}; "
    ops.append((reload + "systemctl reload ironclawd", ["Reloading", "configuration reloaded"]))
    rng.shuffle(ops)
    _, events = rng.choice(ops)
    return [command for command, _ in ops], rng.choice(events)


def assert_change_settled(sysd: Any, change: dict[str, Any]) -> str:
    """The change decided or still pending, never "approved" without an outcome; the agent runs
    its persona exactly when it says "applied"; the audit log verifies (a torn tail is a repair)."""
    shown = ctl_json(sysd, "change", "show", change["id"])
    state = shown["state"]
    assert state in DECIDED, shown
    assert state not in {"failed", "rejected"} or shown.get("note"), shown
    persona = ctl_json(sysd, "agent", "show", "demo")["persona"]
    wanted = json.loads(change["payload_json"])["persona"]
    assert (persona == wanted) == (state == "applied"), (shown, persona)
    proc = sysd.run(["ironctl", "audit", "verify"])
    assert proc.returncode == 0, out(proc)
    return str(state)


def test_random_kills_leave_sessions_and_changes_settled(clean: Any) -> None:
    sysd = clean
    rng = random.Random(seed())
    sh(sysd, f"printf {shlex.quote(RATE.format(1000))} > {CONFIG}; systemctl restart ironclawd")
    rounds = kills = 0
    ready: list[float] = []
    outcomes: dict[str, int] = {}
    states: dict[str, str] = {}
    while rounds < CRASH_ROUNDS:
        persona = f"You are crash-tested. Marker {secrets.token_hex(4)}."
        change = ctl_json(sysd, "change", "submit", "--kind", "persona", "--agent", "demo",
                          "--persona", persona, "--reason", "crash test")  # fmt: skip
        commands, event = plan(rng, states, change["id"])
        delay = rng.uniform(0.0, 0.5)
        mark = cursor(sysd)
        seen, took = kill_at(sysd, commands, event, delay)
        ready.append(took)
        rounds += len(commands)
        kills += 1
        states = assert_settled(sysd)
        decided = assert_change_settled(sysd, change)
        # Approved when the kill came, and applied by the restarted daemon as it recovered.
        if f"change {change['id']} approved by" in journal_since(sysd, mark):
            decided += " at start"
        outcomes[decided] = outcomes.get(decided, 0) + 1
        print(
            f"kill {kills}: {delay:.3f}s after {event!r} ({'seen' if seen else 'NOT seen'}) "
            f"during {[c.rpartition('; ')[2] for c in commands]}: READY {took:.2f}s later; "
            f"change {decided}; {sorted(states.values())}"
        )
    print(
        f"{rounds} interrupted operations, {kills} kills; changes: {outcomes}; READY after a "
        f"kill: median {sorted(ready)[len(ready) // 2]:.2f}s, max {max(ready):.2f}s"
    )


# -- a client that leaves mid-create ---------------------------------------------------------


def test_client_deadline_mid_create_leaves_no_session_starting(clean: Any) -> None:
    sysd = clean
    outcomes: list[str] = []
    for batch in range(2):
        sids = [f"deadline{batch}{i}{secrets.token_hex(3)}" for i in range(5)]
        creates = "\n".join(
            f"ironctl --timeout 0.2 session create --agent demo --sid {sid} &" for sid in sids
        )
        sh(sysd, f"{creates}\nwait")
        # The work goes on without its clients and ends settled, never stuck in "starting". A
        # request whose deadline expired before the daemon read it makes no session at all.

        def settled(states: dict[str, str], sids: list[str] = sids) -> bool:
            return all(states.get(sid, "running") in SETTLED for sid in sids)

        states = wait_for(f"sessions {sids} settled", lambda: states_of(sysd), settled, 90)
        made = [sid for sid in sids if sid in states]
        print(f"--timeout 0.2 create x5: {len(made)} sessions made: {sorted(states.values())}")
        outcomes += [states[sid] for sid in made]
        assert_settled(sysd)
        rm = "\n".join(f"ironctl session rm --force {sid} || exit 1" for sid in made)
        assert sh(sysd, rm).returncode == 0
    assert assert_settled(sysd) == {}
    # The work went on after its client left (a start may still fail under load: settled).
    assert "running" in outcomes, outcomes


# -- a fatal start error exits at once -------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ('[admin]\ngroup = "nosuchgroup"\n', "group 'nosuchgroup' does not exist"),
        ('[admin]\nsocket = "/tmp/ironclaw-unsafe/admin.sock"\n', "refusing /tmp/ironclaw-unsafe"),
        # Found only when the admin socket is bound: after the audit log and its writer started.
        ("", "refusing to replace /run/ironclaw/admin.sock: a symlink"),
    ],
    ids=["missing-admin-group", "unsafe-socket-parent", "symlink-at-socket"],
)
def test_fatal_start_error_exits_at_once(clean: Any, config: str, needle: str) -> None:
    sysd = clean
    setup = f"""
        install -d -m 0777 /tmp/ironclaw-unsafe
        printf {shlex.quote(config)} > {CONFIG}
        systemctl stop ironclawd.service
        {"" if config else "ln -sf /nonexistent /run/ironclaw/admin.sock"}
    """
    assert sh(sysd, setup).returncode == 0
    mark = cursor(sysd)
    proc = sysd.run(["systemctl", "start", "ironclawd.service"], timeout=90)
    assert proc.returncode != 0
    sh(sysd, "systemctl stop ironclawd.service")  # no restart loop while the journal is read
    lines = out(
        sysd.run(["journalctl", "--no-pager", "-o", "short-unix", "--after-cursor", mark])
    ).splitlines()
    failed = [ln for ln in lines if needle in ln and ("ironclawd failed" in ln or "invalid" in ln)]
    exited = [ln for ln in lines if "ironclawd.service: Main process exited, code=exited" in ln]
    assert failed, "\n".join(lines)
    assert exited, "\n".join(lines)
    assert "status=1/FAILURE" in exited[0] or "status=78/CONFIG" in exited[0], exited[0]
    took = float(exited[0].split()[0]) - float(failed[0].split()[0])
    print(f"fatal start error: the process exited {took:.3f}s after logging it")
    assert took < 3, f"the process lived {took:.1f}s after its fatal error"
    assert not [ln for ln in lines if "timed out" in ln or "Killing process" in ln], lines
    sh(sysd, f"rm -rf {CONFIG} /tmp/ironclaw-unsafe; systemctl reset-failed ironclawd")
    sh(sysd, "test -L /run/ironclaw/admin.sock && rm /run/ironclaw/admin.sock; true")
    assert sysd.run(["systemctl", "start", "ironclawd.service"]).returncode == 0


# -- a sandbox runsc cannot start -------------------------------------------------------------


def test_a_sandbox_runsc_cannot_start_fails_its_session_at_once_saying_why(clean: Any) -> None:
    """Past ~290 sessions the slice ran out of tasks and runsc failed at once ("fork/exec
    /proc/self/exe: resource temporarily unavailable"), yet each create waited the whole start
    timeout (30 s) and then blamed the agent. Here runsc is starved the same way (an agent whose
    unit may hold 16 tasks; runsc needs ~50): the create fails as soon as the unit does, with the
    unit's result and runsc's last line, and nothing of the session is left."""
    sysd = clean
    config = '[agents.tiny]\nprovider = "mock"\ntasks_max = 16\n'
    assert (
        sh(sysd, f"printf {shlex.quote(config)} > {CONFIG}; systemctl restart ironclawd").returncode
        == 0
    )
    sid = f"starved{secrets.token_hex(3)}"
    proc = sysd.run(["ironctl", "session", "create", "--agent", "tiny", "--sid", sid, "--json"])
    assert proc.returncode != 0, out(proc)
    message = json.loads(proc.stdout)["error"]["message"]
    assert f"sandbox unit ironclaw-sbx-{sid}.service ended (result: exit-code)" in message, message
    assert "before its agent connected; its last output: " in message, message
    assert "in time" not in message, message
    assert assert_settled(sysd)[sid] == "failed"


# -- a clean stop with connected sandboxes ---------------------------------------------------


def test_clean_stop_with_connected_sandboxes_logs_no_traceback(clean: Any) -> None:
    sysd = clean
    sid = f"cleanstop{secrets.token_hex(3)}"
    create(sysd, sid)
    # A message makes the agent open its model socket too (a gRPC connection it keeps).
    proc = sysd.run(["ironctl", "send", sid, "hello"])
    assert proc.returncode == 0, out(proc)
    mark = cursor(sysd)
    assert sysd.run(["systemctl", "stop", "ironclawd.service"]).returncode == 0
    log = journal_since(sysd, mark)
    assert "Traceback" not in log, log
    assert "CancelledError" not in log, log
    assert unit_props(sysd, "ironclawd.service", "Result")["Result"] == "success"
    assert sysd.run(["systemctl", "start", "ironclawd.service"]).returncode == 0
    assert assert_settled(sysd)[sid] == "running"
