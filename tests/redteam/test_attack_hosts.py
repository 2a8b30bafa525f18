"""Attacks by unprivileged host users on a running session, its sockets, keys and queues, the
daemon and its journal (tests/redteam/host_attacks.py, run as each user): ``outsider`` (a plain
user), ``nobody`` (uid 65534, the uid runsc gives its sandbox process) and a throwaway user
made for this module in the private systemd's overlay."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.harness.fixtures import ROOT
from tests.harness.private_systemd import SystemdHarness
from tests.redteam.conftest import (
    RUNNING,
    Sandbox,
    journal_cursor,
    journal_with,
    module_sessions,
    out,
    record,
    sh,
)
from tests.redteam.report import Ledger

pytestmark = pytest.mark.redteam

PYTHON = "/usr/bin/python3"
SCRIPT = ROOT / "tests/redteam/host_attacks.py"
THROWAWAY = f"rt{secrets.token_hex(4)}"
USERS = ("outsider", "nobody", THROWAWAY)

TITLES = {
    "host-users.admin.call": "call the admin API (ListSessions) on admin.sock",
    "host-users.admin.internal-socket": "call the admin API behind the peer-credential front",
    "host-users.model.call": "call GetProfile on a session's model.sock",
    "host-users.gateway.submit": "submit a change on a session's gateway.sock",
    "host-users.sockets.list": "list the sessions' sockets directory",
    "host-users.sockets.plant": "create a file in a session's sockets dir",
    "host-users.keys.read": "read a session's queue key in /run/ironclaw/keys",
    "host-users.queues.read-outbound": "read a session's outbound.db (through the daemon's "
    "outbound mount namespace, /proc/<tid>/root)",
    "host-users.mntns.open-pin": "open the pin of the daemon's outbound mount namespace",
    "host-users.queues.write-inbound": "write a session's inbound.db",
    "host-users.audit.read": "read the audit log",
    "host-users.code-cache.write": "open the daemon's compiled dataclass code for writing",
    "host-users.code-cache.plant": "create a file in the daemon's cache directory",
    "host-users.cgroup.join-unit": "join the sandbox unit's cgroup (what its sockets trust)",
    "host-users.ptrace.daemon": "PTRACE_ATTACH to ironclawd",
    "host-users.proc.daemon-environ": "read ironclawd's environment",
    "host-users.proc.gofer-root": "list the gofer's root through /proc/<pid>/root",
    "host-users.proc.sandbox-mem": "read the sandbox process's memory",
    "host-users.journal.read": "read ironclawd's journal",
    "host-users.netns.setns": "setns into the session's network namespace",
}


@dataclass
class Target:
    box: Sandbox
    params: dict[str, Any]


def _pid_of(sysd: SystemdHarness, unit: str, argv0: str) -> str:
    script = f"""
        for p in /proc/[0-9]*; do
            grep -qE ':/.*/{unit}$' "$p/cgroup" 2>/dev/null || continue
            [ "$(tr '\\0' ' ' < $p/cmdline | cut -d' ' -f1)" = {argv0} ] && echo "${{p#/proc/}}"
        done
    """
    pids = out(sh(sysd, script)).split()
    assert pids, f"control: no {argv0} process in {unit}"
    return pids[0]


def _mntns_tid(sysd: SystemdHarness) -> str:
    """The daemon's thread in its outbound mount namespace (host/mountns.py), by its name."""
    script = """
        for t in /proc/[0-9]*/task/*; do
            [ "$(cat "$t/comm" 2>/dev/null)" = ironclaw-mntns ] && echo "${t##*/}"
        done
    """
    tids = out(sh(sysd, script)).split()
    assert tids, "control: no ironclaw-mntns thread"
    return tids[0]


@pytest.fixture(scope="module")
def target(daemon: SystemdHarness) -> Iterator[Target]:
    proc = daemon.run(["useradd", "-M", "-s", "/usr/sbin/nologin", THROWAWAY])
    assert proc.returncode == 0, out(proc)
    try:
        with module_sessions(daemon) as sessions:
            box = sessions.create()
            assert box.send("hello").endswith("hello")
            # The unit's cgroup in the name=systemd hierarchy (ControlGroup is its full path).
            group = out(daemon.run(["systemctl", "show", "-P", "ControlGroup", box.unit])).strip()
            procs = f"/sys/fs/cgroup/systemd{group}/cgroup.procs"
            params = {
                "sid": box.sid,
                "daemon_pid": out(
                    daemon.run(["systemctl", "show", "-P", "MainPID", "ironclawd"])
                ).strip(),
                "sandbox_pid": _pid_of(daemon, box.unit, "runsc-sandbox"),
                "gofer_pid": _pid_of(daemon, box.unit, "runsc-gofer"),
                # runsc's parent: it holds the session's netns (no /run/netns name is kept).
                "runsc_pid": out(
                    daemon.run(["systemctl", "show", "-P", "MainPID", box.unit])
                ).strip(),
                "cgroup_procs": procs,
                "mntns_tid": _mntns_tid(daemon),
            }
            assert daemon.run(["test", "-e", params["cgroup_procs"]]).returncode == 0, params
            yield Target(box, params)
    finally:
        daemon.run(["userdel", THROWAWAY])


def attack_as(sysd: SystemdHarness, user: str, params: dict[str, Any]) -> dict[str, Any]:
    site = sysd.run([str(ROOT / ".venv/bin/python"), "-c", "import grpc,sys;print(grpc.__file__)"])
    packages = out(site).strip().rsplit("/grpc/", 1)[0]
    argv = ["env", f"PYTHONPATH={packages}:{ROOT}", PYTHON, str(SCRIPT)]
    proc = sysd.run(argv, user=user, input=json.dumps(params).encode(), timeout=120)
    assert proc.returncode == 0, out(proc)
    results: dict[str, Any] = json.loads(proc.stdout)
    return results


# What root is refused too. The sessions' own sockets trust only processes in the session's
# unit (the tests below check that the daemon logged each refusal); the admin API's internal
# socket answers only calls its peer-credential front vouches for: root reaching it is told so.
ROOT_REFUSED = frozenset({"host-users.model.call", "host-users.gateway.submit"})
# What the daemon logs of them, waited for (bounded) before the verdicts.
REFUSAL_LINES = ("refused a model.sock connection", "refused a gateway.sock connection")
ROOT_ANSWERED = {"host-users.admin.internal-socket": "UNAUTHENTICATED: "}


def test_root_control_every_attack_works_for_root(target: Target, daemon: SystemdHarness) -> None:
    """Control: as root every other attempt succeeds, so each refusal below is the wall (not a
    target that moved, or a broken probe: ENOENT or EIO would be refusals too)."""
    results = attack_as(daemon, "root", target.params)
    assert set(results) == set(TITLES)
    failed = {
        name: r for name, r in results.items()
        if not r["ok"] and name not in ROOT_REFUSED | set(ROOT_ANSWERED)
    }  # fmt: skip
    assert not failed, failed
    for name, answer in ROOT_ANSWERED.items():
        assert str(results[name]["detail"]).startswith(answer), results[name]


@pytest.mark.parametrize("user", USERS)
def test_unprivileged_host_user(
    target: Target, daemon: SystemdHarness, ledger: Ledger, user: str
) -> None:
    stance_user = "throwaway" if user == THROWAWAY else user
    escaped = judged_attacks(daemon, ledger, target, user, f"as {stance_user}", stance_user, "")
    assert target.box.state() == RUNNING
    # The box still works for its own agent after all that.
    assert target.box.send("still here").endswith("still here")
    assert not escaped, escaped


def judged_attacks(
    sysd: SystemdHarness,
    ledger: Ledger,
    target: Target,
    user: str,
    who: str,
    suffix: str,
    title: str,
) -> list[tuple[str, dict[str, Any]]]:
    """Every attack of host_attacks.py run as ``user``, each recorded (id ``<attack>.<suffix>``,
    ``title`` after its own), judged contained only if refused, the sockets dir unchanged and,
    for the model and gateway sockets, the daemon's refusal in its journal; the escapes."""
    sockets = f"ls -la --time-style=+ /run/ironclaw/sessions/{target.box.sid}"
    mark = journal_cursor(sysd)
    before = out(sh(sysd, sockets))
    results = attack_as(sysd, user, target.params)
    after = out(sh(sysd, sockets))
    journal = journal_with(sysd, mark, REFUSAL_LINES)
    assert set(results) == set(TITLES)
    unchanged = before == after
    escaped = []
    for attack_id, r in sorted(results.items()):
        contained = r["ok"] is False and unchanged
        evidence = f"{who}: {r['errno'] or 'refused'}: {r['detail']}"
        if attack_id in ("host-users.model.call", "host-users.gateway.submit"):
            sock = attack_id.split(".")[1]
            logged = f"refused a {sock}.sock connection" in journal
            contained = contained and logged
            evidence += f"; daemon logged the refusal: {logged}"
        record(
            ledger, f"{attack_id}.{suffix}", "host-users", TITLES[attack_id] + title, contained,
            evidence + ("" if unchanged else "; the sockets dir CHANGED"),
            stance="host-user", error=r["ok"] is None,
        )  # fmt: skip
        if not contained:
            escaped.append((attack_id, r))
    return escaped
