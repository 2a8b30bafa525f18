"""Containment of a real session, attacked from inside its sandbox and from unprivileged host users.

Every session here is made by ``ironctl session create --agent demo`` under ironclawd.service in
the private systemd; the attacker is the agent's own binary, run with ``runsc exec`` as the
agent's uid inside that session's sandbox (conftest.py). Each denial is set against a control that
shows the same attempt succeeding where it should, so no test passes because its probe is blind.

Network traffic goes only to loopback and to addresses no route can reach (RFC 5737 TEST-NET-2,
RFC 3849 2001:db8::/32), never to a public address.
"""

from __future__ import annotations

import errno
import json
import secrets
import shlex
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.known_gaps import KnownGap
from tests.harness.private_systemd import SystemdHarness
from tests.redteam.conftest import (
    RUNNING,
    RUNSC_ROOT,
    HostListener,
    Sandbox,
    Sessions,
    journal_cursor,
    journal_since,
    out,
    record_outcome,
    sh,
)
from tests.redteam.containment_ids import ATTACKS
from tests.redteam.report import Ledger

pytestmark = pytest.mark.redteam

# The host's interpreter at a path every user can reach (root's PATH may hold a pyenv shim).
PYTHON = "/usr/bin/python3"
ADMIN_SOCKET = "/run/ironclaw/admin.sock"
INTERNAL_ADMIN_SOCKET = "/run/ironclaw/internal/admin-grpc.sock"
STATE_DIR = "/var/lib/ironclaw"
UNROUTABLE = ("198.51.100.1:53", "[2001:db8::1]:53")
# gVisor's netstack says EHOSTUNREACH where Linux says ENETUNREACH; both mean "no route".
NO_ROUTE = {"ENETUNREACH", "EHOSTUNREACH"}
REFUSAL = "refused a control connection from outside its unit"
# What a session's own sockets directory may hold (docs/architecture.md §8); nothing else of
# /run/ironclaw may show inside.
SESSION_SOCKETS = {"control.sock", "model.sock", "egress.sock", "gateway.sock", "mcp.sock"}


@pytest.fixture(autouse=True)
def _recorded(request: pytest.FixtureRequest, ledger: Ledger) -> Iterator[None]:
    yield
    entry = ATTACKS.get(request.node.originalname)
    if entry is not None:
        attack_id, category, stance, title = entry
        user = getattr(request.node, "callspec", None)
        suffix = f".{user.params['user']}" if user is not None else ""
        record_outcome(request, ledger, attack_id + suffix, category, title, stance)


def only_own_sockets(listing: list[str] | None) -> bool:
    """What the agent sees of its sockets directory. The directory is 0711 on the host, so the
    agent cannot list it at all (None); if it ever can, only its own sockets may be there."""
    return listing is None or ("control.sock" in listing and set(listing) <= SESSION_SOCKETS)


def assert_only_own_sockets(box: Sandbox, report: dict[str, Any]) -> None:
    """The mounted directory, seen from both sides: the host's copy holds only this session's
    sockets, and inside the agent reaches its control socket without being able to list."""
    assert only_own_sockets(report["run_ironclaw"]), report["run_ironclaw"]
    host = box.sysd.run(["ls", "-A", f"/run/ironclaw/sessions/{box.sid}"])
    names = set(host.stdout.decode().split())
    assert "control.sock" in names, names
    assert names <= SESSION_SOCKETS, names
    inside = box.probe("--probe-path=/run/ironclaw/control.sock")["paths"]
    assert inside["/run/ironclaw/control.sock"]["exists"] is True, inside


def by_target(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["target"], r["proto"]): r for r in report["net"]}


# -- 1. network ---------------------------------------------------------------------------------


def test_only_loopback_no_route_no_dns_and_the_hosts_loopback_is_out_of_reach(
    sessions: Sessions, host_listener: HostListener, daemon: SystemdHarness
) -> None:
    # Control: from the daemon's side of the wall, the host listener is reachable both ways.
    port = host_listener.port
    reach = f"exec 3<>/dev/tcp/127.0.0.1/{port}; printf control >/dev/udp/127.0.0.1/{port}"
    assert sh(daemon, reach).returncode == 0
    accepted = host_listener.accept(timeout=5)
    assert accepted is not None, "control: the host listener got no TCP connection"
    accepted.close()
    assert host_listener.receive(timeout=5) == b"control"

    box = sessions.create()
    report = box.probe(f"--probe-net=127.0.0.1:{port}", *(f"--probe-net={t}" for t in UNROUTABLE))

    assert report["net_dev_interfaces"] == ["lo"]
    assert report["sys_class_net"] == ["lo"]
    assert report["routes"] == []
    # IPv6: no route except, at most, loopback's own.
    assert all(line.split()[-1] == "lo" for line in report["ipv6_routes"] or []), report
    assert report["resolv_conf_exists"] is False

    net = by_target(report)
    # 127.0.0.1 inside is gVisor's own loopback: nothing listens there, and nothing arrives here.
    assert net[(f"127.0.0.1:{port}", "tcp")]["connected"] is False
    assert net[(f"127.0.0.1:{port}", "tcp")]["errno"] == "ECONNREFUSED"
    assert host_listener.accept(timeout=1) is None, "a connection from the sandbox reached the host"
    assert host_listener.receive(timeout=1) is None, "a datagram from the sandbox reached the host"
    for target in UNROUTABLE:
        for proto in ("tcp", "udp"):
            result = net[(target, proto)]
            assert result["connected"] is False, result
            assert result["errno"] in NO_ROUTE, result


# -- 2. host paths ------------------------------------------------------------------------------


def test_host_paths_are_not_there(sessions: Sessions, daemon: SystemdHarness) -> None:
    marker = f"/etc/ironclaw-redteam-{secrets.token_hex(6)}"
    host_only = [
        "/etc/shadow",
        "/root",
        STATE_DIR,
        ADMIN_SOCKET,
        "/run/ironclaw/internal",
        "/run/ironclaw/sessions",
        "/run/ironclaw/keys",
        "/run/ironclaw/runsc",
        "/run/netns",
        "/run/systemd",
        "/run/dbus/system_bus_socket",
        marker,
    ]
    assert sh(daemon, f"echo secret > {marker}").returncode == 0
    try:
        box = sessions.create()
        # Control: every one of these exists on the host (the probe asks about real paths).
        for path in host_only:
            assert daemon.run(["test", "-e", path]).returncode == 0, f"control: {path} on host"
        report = box.probe(*(f"--probe-path={p}" for p in [*host_only, "/etc/passwd"]))
    finally:
        daemon.run(["rm", "-f", marker])

    seen = {path: r for path, r in report["paths"].items() if r["exists"]}
    # Control: the probe does see what the agent rootfs has.
    assert seen.pop("/etc/passwd")["readable"] is True
    assert seen == {}, f"host paths visible inside: {seen}"
    assert_only_own_sockets(box, report)
    assert "var" not in report["top_level"]


# -- 3. privileges and filesystem ---------------------------------------------------------------


def test_no_privileges_readonly_root_and_only_a_noexec_workspace(sessions: Sessions) -> None:
    box = sessions.create()
    report = box.probe()

    assert (report["uid"], report["euid"], report["gid"], report["egid"]) == (
        box.uid,
        box.uid,
        box.gid,
        box.gid,
    )
    assert box.uid != 0
    assert box.gid != 0
    assert report["groups"] == []
    caps = {k: v for k, v in report["status"].items() if k.startswith("Cap")}
    assert {"CapInh", "CapPrm", "CapEff", "CapBnd"} <= set(caps), report["status"]
    assert set(caps.values()) == {0}, caps
    assert report["no_new_privs"] == 1

    mounts = {line.split()[1]: line.split()[3].split(",") for line in report["mounts"]}
    assert "ro" in mounts["/"]
    assert "ro" in mounts["/tmp"]
    assert "noexec" in mounts["/workspace"]
    assert "rw" in mounts["/workspace"]
    writable = {path for path, r in report["writable"].items() if r["writable"]}
    assert writable == {"/workspace"}, report["writable"]
    assert report["root"]["writable"] is False

    # The script was written (the workspace is writable) and then refused by noexec.
    assert report["workspace_exec"] == {"written": True, "executed": False, "errno": "EACCES"}


def test_the_agent_process_itself_runs_unprivileged(sessions: Sessions) -> None:
    box = sessions.create()
    proc = box.runsc("ps", box.container)  # UID PID PPID C TTY STIME TIME CMD
    assert proc.returncode == 0, out(proc)
    header, *rows = (line.split() for line in proc.stdout.decode().splitlines())
    table = [dict(zip(header, row, strict=True)) for row in rows]
    agent = next(row for row in table if row["PID"] == "1")
    assert agent["CMD"] == "agent"
    assert agent["UID"] == str(box.uid)


# -- 4. sessions do not see each other ----------------------------------------------------------


def test_a_session_sees_nothing_of_another(sessions: Sessions) -> None:
    a, b = sessions.create(), sessions.create()
    b_socket = f"/run/ironclaw/sessions/{b.sid}/control.sock"
    report = a.probe(
        f"--probe-path={b_socket}",
        f"--probe-path=/run/ironclaw/sessions/{b.sid}",
        f"--probe-unix={b_socket}",
    )
    plain = a.probe()
    control = b.probe()

    assert_only_own_sockets(a, report)
    assert not any(r["exists"] for r in report["paths"].values()), report["paths"]
    assert report["unix"] == [
        {"path": b_socket, "connected": False, "errno": "ENOENT"},
    ]
    assert plain["hostname"] == f"sbx-{a.sid}"
    # Processes: only A's. Control: the probe can read the agent's sid from /proc at all.
    sids = {p["sid"] for p in plain["processes"] if p["sid"] is not None}
    assert sids == {a.sid}, plain["processes"]
    assert {p["sid"] for p in control["processes"] if p["sid"]} == {b.sid}
    # B's sid appears nowhere in what A can see.
    assert b.sid not in json.dumps(plain)
    assert b.state() == RUNNING


# -- 5. it really is gVisor ---------------------------------------------------------------------


def test_the_kernel_is_gvisor_and_the_host_runs_only_runsc(
    sessions: Sessions, daemon: SystemdHarness
) -> None:
    box = sessions.create()
    report = box.probe()
    host_release = daemon.run(["uname", "-r"]).stdout.decode().strip()
    host_version = daemon.run(["cat", "/proc/version"]).stdout.decode().strip()

    assert report["uname"]["sysname"] == "Linux"
    assert report["uname"]["release"] != host_release
    assert report["proc_version"] != host_version
    assert report["proc_version"].startswith(f"Linux version {report['uname']['release']} ")
    kernel_log = report["kernel_log"]["text"]
    if kernel_log is not None:  # gVisor serves its own boot messages to syslog(2)
        assert host_release not in kernel_log
        assert "gVisor" in kernel_log, kernel_log

    # Host side: the unit holds runsc processes only, never the agent binary itself.
    script = f"""
        for p in /proc/[0-9]*; do
            grep -qE ':/.*/{box.unit}$' "$p/cgroup" 2>/dev/null || continue
            printf '%s\\t%s\\t%s\\n' "${{p#/proc/}}" "$(readlink "$p/exe")" \
                "$(tr '\\0' ' ' < "$p/cmdline")"
        done
    """
    rows = [line.split("\t") for line in sh(daemon, script).stdout.decode().splitlines()]
    assert rows, f"control: no process found in {box.unit}"
    runsc = daemon.run(["readlink", "-f", "/usr/bin/runsc"]).stdout.decode().strip()
    assert {exe for _, exe, _ in rows} == {runsc}, rows
    cmdlines = " ".join(cmd for _, _, cmd in rows)
    assert "runsc-sandbox" in cmdlines
    assert "runsc-gofer" in cmdlines
    assert "/app/agent/agent" not in {cmd.split(" ")[0] for _, _, cmd in rows}


# -- 6. unprivileged host users -----------------------------------------------------------------

_CONNECT_AND_HELLO = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
s.connect(sys.argv[1])
try:
    s.sendall(b"hello 1 10000\\n")
    print("kept" if s.recv(1) else "closed")
except socket.timeout:
    print("kept")
except OSError:
    print("closed")
"""


@pytest.mark.parametrize("user", ["outsider", "alice"])
def test_host_user_is_turned_away_from_the_control_socket(
    sessions: Sessions, daemon: SystemdHarness, user: str
) -> None:
    box = sessions.create()
    path = f"/run/ironclaw/sessions/{box.sid}/control.sock"
    mark = journal_cursor(daemon)
    proc = daemon.run([PYTHON, "-c", _CONNECT_AND_HELLO, path], user=user)
    assert proc.returncode == 0, out(proc)
    assert proc.stdout.decode().strip() == "closed"
    assert f"session {box.sid}: {REFUSAL}" in journal_since(daemon, mark)
    # The agent's own connection and session are untouched.
    assert box.state() == RUNNING
    assert daemon.run(["systemctl", "is-active", box.unit]).stdout.decode().strip() == "active"
    assert "sandbox exited" not in journal_since(daemon, mark)
    assert_only_own_sockets(box, box.probe())


def test_host_user_with_a_delegated_cgroup_named_like_the_unit_is_turned_away(
    sessions: Sessions, daemon: SystemdHarness
) -> None:
    """systemd delegates a cgroup subtree to every logged-in user (user@<uid>.service has
    Delegate=yes); in it a user may create a cgroup called ``ironclaw-sbx-<sid>.service``."""
    box = sessions.create()
    path = f"/run/ironclaw/sessions/{box.sid}/control.sock"
    group = daemon.run(["systemctl", "show", "-P", "ControlGroup", "ironclawd.service"])
    root = group.stdout.decode().strip().rsplit("/", 2)[0]  # <root>/system.slice/ironclawd.service
    mount = "$(for m in /sys/fs/cgroup /sys/fs/cgroup/unified; do "
    mount += "[ -e $m/cgroup.controllers ] && { echo $m; break; }; done)"
    delegated = f"{root}/redteam-user-{secrets.token_hex(4)}"
    spoof = f"{delegated}/{box.unit}"
    as_user = f"""
        mkdir "$fs{spoof}" && echo $$ > "$fs{spoof}/cgroup.procs" \
            && grep -q ':{spoof}$' /proc/self/cgroup && echo in-spoofed-cgroup >&2
        exec {PYTHON} -c {shlex.quote(_CONNECT_AND_HELLO)} {path}
    """
    script = f"""
        set -e
        fs={mount}; export fs
        mkdir "$fs{delegated}"
        # What systemd does for Delegate=yes: the directory and its procs/threads files.
        chown outsider "$fs{delegated}" "$fs{delegated}"/cgroup.{{procs,threads}}
        echo $$ > "$fs{delegated}/cgroup.procs"
        setpriv --reuid=outsider --regid=outsider --init-groups -- bash -c {shlex.quote(as_user)}
    """
    mark = journal_cursor(daemon)
    try:
        proc = sh(daemon, script)
    finally:
        cleanup = f"fs={mount}; rmdir $fs{spoof} $fs{delegated} 2>/dev/null; true"
        sh(daemon, cleanup)
    # Control: the user's process really was in a cgroup whose path ends like the unit's.
    assert "in-spoofed-cgroup" in proc.stderr.decode(), out(proc)
    assert proc.stdout.decode().strip() == "closed", out(proc)
    assert f"session {box.sid}: {REFUSAL}" in journal_since(daemon, mark)
    assert box.state() == RUNNING


@pytest.mark.parametrize("user", ["outsider", "alice"])
def test_host_user_cannot_read_state_enter_the_netns_or_drive_runsc(
    sessions: Sessions, daemon: SystemdHarness, user: str
) -> None:
    box = sessions.create()
    attempts = {
        "list state dir": ["ls", STATE_DIR],
        "read state db": ["cat", f"{STATE_DIR}/state.db"],
        "read bundle": ["cat", f"{STATE_DIR}/bundles/{box.sid}/config.json"],
        # The session keeps no /run/netns name: its netns is reachable only through the
        # sandbox unit's main process, which is root's.
        "enter netns": ["nsenter", f"--net={box.netns}", "true"],
        "runsc list": ["runsc", f"--root={RUNSC_ROOT}", "list"],
        "runsc exec": ["runsc", f"--root={RUNSC_ROOT}", "exec", box.container, "/app/agent/agent"],
        "read runsc state": ["ls", RUNSC_ROOT],
    }
    for what, argv in attempts.items():
        # Control: root can (runsc from inside the session's netns; see conftest.py).
        as_root = box.runsc("list") if what.startswith("runsc") else daemon.run(argv)
        assert as_root.returncode == 0, f"control ({what} as root): {out(as_root)}"
        proc = daemon.run(argv, user=user, timeout=30)
        # runsc list exits 0 with an empty table when it cannot read its root: what matters is
        # that it names nothing.
        if what != "runsc list":
            assert proc.returncode != 0, f"{user} could {what}: {out(proc)}"
        assert box.sid not in proc.stdout.decode(), f"{user}: {what}: {out(proc)}"
    assert box.state() == RUNNING


def test_runsc_control_socket_is_only_in_the_sessions_netns(
    sessions: Sessions, daemon: SystemdHarness
) -> None:
    """runsc's controller is an abstract Unix socket: it exists only in the session's netns,
    which no host user can enter. From the host's netns nobody reaches it."""
    box = sessions.create()
    listing = daemon.run(box.in_netns("cat", "/proc/net/unix"))
    names = [
        line.split()[-1] for line in listing.stdout.decode().splitlines() if box.container in line
    ]
    assert names, f"control: no runsc socket in the netns: {names}"
    assert names[0].startswith("@"), f"control: no runsc socket in the netns: {names}"
    name = names[0]  # /proc/net/unix shows each NUL of an abstract address as "@"
    code = (
        "import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
        "try:\n s.connect(sys.argv[1].replace('@', '\\0')); print('connected')\n"
        "except OSError as e:\n print(e.errno)\n"
    )
    # Control: from inside the session's netns, root reaches it.
    inside = daemon.run(box.in_netns(PYTHON, "-c", code, name))
    assert inside.stdout.decode().strip() == "connected", out(inside)
    for user in ("outsider", "alice", None):
        proc = daemon.run([PYTHON, "-c", code, name], user=user)
        assert proc.stdout.decode().strip() == str(errno.ECONNREFUSED), (user, out(proc))


@pytest.mark.xfail(
    raises=KnownGap,
    strict=True,
    reason="runsc 20221219 runs its sandbox process as host uid 65534 (nobody), hard-coded; any "
    "host process running as nobody may signal (kill) it. Mitigation: no host service runs as "
    "nobody, or a runsc that takes a dedicated uid.",
)
def test_host_nobody_cannot_signal_the_sandbox(sessions: Sessions, daemon: SystemdHarness) -> None:
    box = sessions.create()
    script = f"""
        for p in /proc/[0-9]*; do
            grep -qE ':/.*/{box.unit}$' "$p/cgroup" 2>/dev/null && echo "${{p#/proc/}}"
        done
    """
    pids = sh(daemon, script).stdout.decode().split()
    assert pids, f"control: no process in {box.unit}"
    answers = {}
    for pid in pids:
        # Signal 0 only checks permission; nothing is delivered.
        proc = daemon.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           "kill", "-0", pid])  # fmt: skip
        answers[pid] = (proc.returncode, out(proc).strip())
    # Controls (plain assertions, outside the expected failure): every answer is the kernel's
    # permission check (allowed, or EPERM), not a setpriv or kill that could not run; a process
    # gone meanwhile is no answer; and nobody is refused runsc's own root processes, so the
    # check can refuse.
    judged = {pid: a for pid, a in answers.items() if "No such process" not in a[1]}
    unjudged = {pid: a for pid, a in judged.items()
                if a[0] != 0 and "Operation not permitted" not in a[1]}  # fmt: skip
    assert not unjudged, f"control: {unjudged}"
    assert any(code != 0 for code, _ in judged.values()), f"control: {answers}"
    signalled = sorted(pid for pid, (code, _) in judged.items() if code == 0)
    if signalled:
        raise KnownGap(f"nobody may signal pids {signalled} of {box.unit}")


# -- 7. the admin API is out of reach -----------------------------------------------------------


def test_admin_sockets_are_not_reachable_from_inside(
    sessions: Sessions, daemon: SystemdHarness
) -> None:
    box = sessions.create()
    code = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n"
    for path in (ADMIN_SOCKET, INTERNAL_ADMIN_SOCKET):
        # Control: on the host (as root) both sockets accept a connection.
        proc = daemon.run([PYTHON, "-c", code, path])
        assert proc.returncode == 0, f"control: {path}: {out(proc)}"

    report = box.probe(
        f"--probe-unix={ADMIN_SOCKET}",
        f"--probe-unix={INTERNAL_ADMIN_SOCKET}",
        f"--probe-path={ADMIN_SOCKET}",
        "--probe-path=/run/ironclaw/internal",
    )
    for result in report["unix"]:
        assert result["connected"] is False, result
        assert result["errno"] == "ENOENT", result
    assert not any(r["exists"] for r in report["paths"].values()), report["paths"]
