"""The warm pool against the real daemon, systemd and runsc (issue 17): sessions claim
pre-started sandboxes, two creates at once get two different ones, the pool refills, ``rm``
destroys a claimed one, an explicit ``--sid`` cannot take a pooled id, and neither a restart nor
a killed daemon leaves an unclaimed sandbox behind. Timings are never asserted."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.harness.polling import wait_for
from tests.harness.pool import pool_config, pool_ready, pooled_daemon, wait_pool_ready
from tests.integration.test_sessions import (
    ctl,
    cursor,
    journal_since,
    leftovers,
    remove_all_sessions,
    sh,
    wait_recovered,
)

pytestmark = pytest.mark.integration

READY = re.compile(r"pool: sandbox ([a-z0-9]+) of agent demo ready")


@pytest.fixture(scope="module")
def pooled(daemon: Any) -> Iterator[Any]:
    """The daemon with a pool of two sandboxes for the demo agent, no session before or after."""
    remove_all_sessions(daemon)
    with pooled_daemon(daemon, pool_config(size=2)):
        wait_recovered(daemon)
        yield daemon
        remove_all_sessions(daemon)


def data_left(sysd: Any, sid: str) -> list[str]:
    """A session's queue directory and key file, where they exist."""
    paths = [f"/var/lib/ironclaw/queues/{sid}", f"/run/ironclaw/keys/{sid}"]
    proc = sh(sysd, " ".join(f"test -e {p} && echo {p};" for p in paths) + " true")
    return list(proc.stdout.decode().split())


def nothing_left(sysd: Any, sid: str) -> dict[str, list[str]]:
    found = leftovers(sysd, sid)
    if data := data_left(sysd, sid):
        found["data"] = data
    return found


def wait_gone(sysd: Any, sid: str) -> None:
    def left() -> dict[str, list[str]]:
        return nothing_left(sysd, sid)

    wait_for(f"nothing left of pooled sandbox {sid}", left, lambda found: found == {}, 60)


def this_run_log(sysd: Any) -> str:
    """Everything the daemon's current run logged."""
    invocation = sh(sysd, "systemctl show -P InvocationID ironclawd").stdout.decode().strip()
    assert invocation, "ironclawd has no invocation id"
    proc = sh(sysd, f"journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID={invocation}")
    return str(proc.stdout.decode())


def ready_sids(sysd: Any, mark: str) -> list[str]:
    return READY.findall(journal_since(sysd, mark))


def create(sysd: Any) -> str:
    code, doc = ctl(sysd, "session", "create", "--agent", "demo")
    assert code == 0, doc
    assert doc["state"] == "running", doc
    return str(doc["sid"])


def send(sysd: Any, sid: str, text: str) -> str:
    code, doc = ctl(sysd, "send", sid, text)
    assert code == 0, doc
    return str(doc["reply"]["text"])


def test_sessions_claim_distinct_pooled_sandboxes_and_the_pool_refills(pooled: Any) -> None:
    sysd = pooled
    mark = cursor(sysd)
    wait_pool_ready(sysd, count=2)
    code, status = ctl(sysd, "status")
    assert code == 0, status
    assert status["pool"] == [{"agent": "demo", "ready": 2}], status

    # Two creates at once: each gets a sandbox of its own, both from the pool.
    with ThreadPoolExecutor(2) as workers:
        a, b = workers.map(lambda _: create(sysd), range(2))
    assert a != b
    # The journal may get a session's line after its create has answered (CI saw one missing
    # when read at once, stop 50): waited for, bounded.
    lines = [f"session {sid} running in a pooled sandbox" for sid in (a, b)]
    log = wait_for("both sessions logged as pooled", lambda: journal_since(sysd, mark),
                   lambda text: all(line in text for line in lines), 10)  # fmt: skip
    for line in lines:
        assert line in log, log[-3000:]
    # This run of the daemon's: the pool may have filled before ``mark``.
    started = set(READY.findall(this_run_log(sysd)))
    assert {a, b} <= started, (a, b, started)

    # Sealed to its session: its own key and queues work (a reply comes back).
    assert send(sysd, a, "hello a") == "mock: hello a"
    assert send(sysd, b, "hello b") == "mock: hello b"

    # Refilled, with new sandboxes (never a claimed one again).
    wait_pool_ready(sysd, count=2)
    refilled = set(ready_sids(sysd, mark)) - {a, b}
    assert len(refilled) >= 2, ready_sids(sysd, mark)

    # An explicit --sid may not take a pooled id.
    held = sorted(refilled)[0]
    code, doc = ctl(sysd, "session", "create", "--agent", "demo", "--sid", held)
    assert code != 0, doc
    assert "taken" in json.dumps(doc), doc

    # rm destroys a claimed sandbox with everything of its session.
    for sid in (a, b):
        code, doc = ctl(sysd, "session", "rm", "--force", sid)
        assert code == 0, doc
        assert nothing_left(sysd, sid) == {}, sid


def test_restart_and_kill_leave_no_unclaimed_sandbox(pooled: Any) -> None:
    sysd = pooled
    mark = cursor(sysd)
    sh(sysd, "systemctl restart ironclawd")
    wait_recovered(sysd)
    wait_pool_ready(sysd, count=2)
    first = set(ready_sids(sysd, mark))
    assert len(first) >= 2, first

    # A restart destroys the unclaimed sandboxes (and the new run fills the pool again).
    mark = cursor(sysd)
    assert sh(sysd, "systemctl restart ironclawd").returncode == 0
    wait_recovered(sysd)
    stopping = journal_since(sysd, mark)
    for sid in first:
        assert f"pool: stopping sandbox {sid}" in stopping, stopping[-3000:]
        left = nothing_left(sysd, sid)
        # systemd drops the mount unit of a netns name when it next reads mountinfo, which it
        # rate-limits: that unit may outlive the mount by a moment (seen once in CI, with the
        # mount itself gone). Everything else is gone when the restart has returned.
        units = left.pop("unit", [])
        assert all(u.endswith(".mount") for u in units), (sid, units)
        assert left == {}, sid
        wait_gone(sysd, sid)
    wait_pool_ready(sysd, count=2)
    second = set(ready_sids(sysd, mark)) - first
    assert len(second) >= 2, second

    # A killed daemon cannot destroy them: the next run removes them as orphans.
    mark = cursor(sysd)
    assert (
        sh(
            sysd,
            "systemctl kill -s KILL ironclawd; sleep 0.5; "
            "systemctl reset-failed ironclawd; systemctl start ironclawd",
        ).returncode
        == 0
    )
    wait_recovered(sysd)
    for sid in second:
        wait_gone(sysd, sid)
    assert pool_ready(sysd) <= 2


def test_a_reload_resizes_the_pool(pooled: Any) -> None:
    sysd = pooled
    wait_pool_ready(sysd, count=2)
    mark = cursor(sysd)
    config = "/etc/ironclaw/ironclawd.toml"
    assert sh(sysd, f"sed -i 's/^size = 2$/size = 0/' {config} && "
                    "systemctl reload ironclawd").returncode == 0  # fmt: skip
    wait_for("the pool emptied", lambda: pool_ready(sysd), lambda n: n == 0, 120)
    gone = re.findall(r"pool: stopping sandbox ([a-z0-9]+)", journal_since(sysd, mark))
    assert len(gone) >= 2, gone
    for sid in gone:
        wait_gone(sysd, sid)
    assert sh(sysd, f"sed -i 's/^size = 0$/size = 2/' {config} && "
                    "systemctl reload ironclawd").returncode == 0  # fmt: skip
    wait_pool_ready(sysd, count=2)


def waiting_pooled_units(sysd: Any) -> list[str]:
    """The running sandbox units the pool holds: started for the pool (their description says
    "pooled") and not claimed by a session since."""
    code, doc = ctl(sysd, "session", "list")
    assert code == 0, doc
    claimed = {f"ironclaw-sbx-{row['sid']}.service" for row in doc["sessions"]}
    out = sh(sysd, "systemctl list-units --plain --no-legend 'ironclaw-sbx-*'").stdout.decode()
    return [line.split()[0] for line in out.splitlines()
            if ", pooled)" in line and " running " in f" {line} "
            and line.split()[0] not in claimed]  # fmt: skip


def agent_waits_on_claim(sysd: Any, unit: str) -> bool:
    """Whether a process of ``unit`` holds a connection to its claim.sock: the sandbox's end of
    it lives in the sandbox's own network namespace, so each process's view is looked at."""
    script = (
        f"cg=$(systemctl show -P ControlGroup {unit}); "
        "for base in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified /sys/fs/cgroup; do "
        '  [ -e "$base$cg/cgroup.procs" ] || continue; '
        '  for p in $(cat "$base$cg/cgroup.procs"); do '
        '    grep -q "/claim.sock$" "/proc/$p/net/unix" 2>/dev/null && echo yes && exit 0; '
        "  done; done; true"
    )
    return bool(sh(sysd, script).stdout.decode().strip() == "yes")


def test_a_pooled_sandbox_that_died_waiting_is_replaced_before_a_claim(pooled: Any) -> None:
    # A waiting agent holds a connection to claim.sock; killed, the connection ends and the pool
    # destroys that sandbox and starts another at once, so no create claims a dead one (and
    # waits for a cold start) and nothing of it stays. (A claim that still meets a dead one
    # falls back to a cold start: tests/unit/test_pool_bookkeeping.py.)
    sysd = pooled
    wait_pool_ready(sysd, count=2)
    units = waiting_pooled_units(sysd)
    assert len(units) == 2, units
    killed = [u.removeprefix("ironclaw-sbx-").removesuffix(".service") for u in units]
    # "Ready" is the unit started; its agent connects to claim.sock ~0.7 s later. A sandbox that
    # dies before that is found at its claim instead (the unit test's cold start).
    wait_for("both pooled agents wait on claim.sock", lambda: [u for u in units
             if not agent_waits_on_claim(sysd, u)], lambda left: left == [], 60)  # fmt: skip
    mark = cursor(sysd)
    for unit in units:
        assert sh(sysd, f"systemctl kill -s KILL {unit}").returncode == 0

    def replaced() -> list[str]:
        log = journal_since(sysd, mark)
        return [sid for sid in killed
                if f"pool: sandbox {sid} of agent demo ended while it waited for a claim; "
                   "replacing it" in log]  # fmt: skip

    wait_for("the pool noticed both deaths", replaced, lambda found: len(found) == 2, 60)
    for sid in killed:
        wait_gone(sysd, sid)
    wait_pool_ready(sysd, count=2)
    assert not set(killed) & set(ready_sids(sysd, mark)), "a dead sandbox came back"
    sid = create(sysd)
    assert sid not in killed
    assert f"session {sid} running in a pooled sandbox" in journal_since(sysd, mark)
    assert send(sysd, sid, "after") == "mock: after"
    code, doc = ctl(sysd, "session", "rm", "--force", sid)
    assert code == 0, doc
    assert nothing_left(sysd, sid) == {}, sid
    wait_pool_ready(sysd, count=2)
