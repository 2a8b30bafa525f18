"""The sessions' outbound tmpfs live in ironclawd's own mount namespace (host/mountns.py), so
that no sandbox unit start copies them (creation flat in the session count, issue 17).

Shown on the real daemon in the private systemd: a running session adds no mount to the
table systemd copies, its tmpfs is in the daemon's namespace and in its own unit's, never in
another session's; the namespace and what its tmpfs hold outlive daemon restarts (running and
stopped sessions alike); a tmpfs an older version mounted on the host is moved off the host's
table at the first start that makes the namespace, with its data; and a sandbox unit whose
wrapper gets no tmpfs never starts runsc.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ironclaw.admin.v1 import admin_pb2
from tests.harness.boxes import (
    AGENT_UID,
    QUEUES,
    RPC_TIMEOUT,
    Box,
    Boxes,
    host_copy,
    open_boxes,
    open_db,
    out,
    restart,
    restarted_with,
    sh,
)
from tests.harness.private_systemd import MNTNS_PIN, SystemdHarness
from tests.integration.test_messages import AGENT, AGENT_CONFIG

pytestmark = pytest.mark.integration


def mount_points(sysd: SystemdHarness, argv_prefix: list[str]) -> list[str]:
    proc = sysd.run([*argv_prefix, "findmnt", "-rn", "-o", "TARGET"])
    assert proc.returncode == 0, out(proc)
    return out(proc).split()


def host_points(sysd: SystemdHarness) -> list[str]:
    """Mount points in the table PID 1 copies into every new unit."""
    return mount_points(sysd, ["nsenter", "-t", "1", "-m", "--"])


def ns_points(sysd: SystemdHarness) -> list[str]:
    return mount_points(sysd, sysd.in_outbound_ns([]))


def unit_points(sysd: SystemdHarness, box: Box) -> list[str]:
    main = out(sysd.run(["systemctl", "show", "-P", "MainPID", box.unit])).strip()
    return mount_points(sysd, ["nsenter", "-t", main, "-m", "--"])


def outbound_of(box: Box) -> str:
    return f"{QUEUES}/{box.sid}/outbound"


def ns_inode(sysd: SystemdHarness) -> str:
    proc = sysd.run(["stat", "-L", "-c", "%i", MNTNS_PIN])
    assert proc.returncode == 0, out(proc)
    return out(proc).strip()


def replies_in_outbound(box: Box, key: bytes, tmp_path: Path) -> list[tuple[int, str]]:
    """The rows of the session's outbound.db (read from a copy, with the session's key: its
    key file goes when the sandbox stops)."""
    with (
        host_copy(box.outbound_db, tmp_path) as copy,
        contextlib.closing(open_db(copy, key)) as conn,
    ):
        return [(int(s), str(b)) for s, b in conn.execute("SELECT seq, body FROM messages")]


@pytest.fixture(scope="module")
def test_agent(daemon: SystemdHarness) -> Iterator[None]:
    """The daemon restarted with the test agent defined; the default config again afterwards."""
    with restarted_with(daemon, AGENT_CONFIG):
        yield


@pytest.fixture
def boxes(daemon: SystemdHarness, test_agent: None) -> Iterator[Boxes]:
    """Sessions of the test agent; every one left is removed at the end, pass or fail."""
    with open_boxes(daemon, AGENT) as made:
        yield made


@pytest.fixture
def two(boxes: Boxes) -> tuple[Box, Box]:
    first, second = boxes.create(), boxes.create()
    for box in (first, second):
        box.exchange("hello")
    return first, second


def test_a_running_session_adds_no_mount_to_the_host(
    daemon: SystemdHarness, two: tuple[Box, Box]
) -> None:
    first, second = two
    host = host_points(daemon)
    assert not [p for p in host if p.startswith(f"{QUEUES}/")], host
    ns = ns_points(daemon)
    assert {outbound_of(first), outbound_of(second)} <= set(ns), ns
    # The namespace keeps little of the host's: no other file system stays busy because of it.
    assert len(ns) <= 3 + len([p for p in ns if p.startswith(f"{QUEUES}/")]), ns
    # Each unit has its own session's tmpfs (moved in by its wrapper), never the other's.
    for box, other in ((first, second), (second, first)):
        seen = unit_points(daemon, box)
        assert outbound_of(box) in seen, seen
        assert outbound_of(other) not in seen, seen
    fstype = daemon.run([*daemon.in_outbound_ns([]), "findmnt", "-rn", "-o", "FSTYPE,OPTIONS",
                         outbound_of(first)])  # fmt: skip
    assert out(fstype).startswith("tmpfs"), out(fstype)
    for option in ("nosuid", "nodev", "noexec"):
        assert option in out(fstype), out(fstype)


def test_outbound_queues_outlive_daemon_restarts(
    daemon: SystemdHarness, two: tuple[Box, Box], tmp_path: Path
) -> None:
    running, stopped = two
    running.exchange("before")
    key = stopped.key()
    stopped.stub.StopSession(admin_pb2.StopSessionRequest(sid=stopped.sid), timeout=RPC_TIMEOUT)
    kept = replies_in_outbound(stopped, key, tmp_path)
    assert kept, "the stopped session's outbound.db holds its replies"
    inode = ns_inode(daemon)
    for _ in range(2):
        restart(daemon)
        assert ns_inode(daemon) == inode  # the same namespace, entered again
    assert replies_in_outbound(stopped, key, tmp_path) == kept
    running.exchange("after")
    stopped.stub.StartSession(admin_pb2.StartSessionRequest(sid=stopped.sid), timeout=RPC_TIMEOUT)
    stopped.exchange("back")
    proc = daemon.run(["ironctl", "session", "verify", stopped.sid])
    assert proc.returncode == 0, out(proc)
    assert not [p for p in host_points(daemon) if p.startswith(f"{QUEUES}/")]


def test_a_tmpfs_an_older_version_mounted_on_the_host_moves_into_the_namespace(
    daemon: SystemdHarness, boxes: Boxes, tmp_path: Path
) -> None:
    """As after an upgrade: the session's tmpfs is a host mount and no namespace is pinned.
    The first start moves it off the host's table; its data stays, the session goes on."""
    box = boxes.create()
    box.exchange("one")
    key = box.key()
    box.stub.StopSession(admin_pb2.StopSessionRequest(sid=box.sid), timeout=RPC_TIMEOUT)
    kept = replies_in_outbound(box, key, tmp_path)
    outdir = outbound_of(box)
    saved = f"{QUEUES}-test-{box.sid}"  # on the file system both views share (not /run)
    # Carry the files over to a host tmpfs as the old version had it, then drop the namespace.
    script = f"""set -e
        systemctl stop ironclawd
        mkdir -p {saved}
        nsenter --mount={MNTNS_PIN} -- cp -a {outdir}/. {saved}/
        umount {MNTNS_PIN}
        mount -t tmpfs -o nosuid,nodev,noexec,size=64m,nr_inodes=65,mode=0700 \\
            -o uid={AGENT_UID},gid={AGENT_UID} ironclaw-outbound {outdir}
        cp -a {saved}/. {outdir}/
        rm -rf {saved}
        findmnt -rn -o FSTYPE {outdir}
        systemctl start ironclawd
    """
    proc = sh(daemon, script, timeout=180)
    assert proc.returncode == 0, out(proc)
    assert out(proc).split()[0] == "tmpfs"
    assert outdir not in host_points(daemon)
    assert outdir in ns_points(daemon)
    assert replies_in_outbound(box, key, tmp_path) == kept
    box.stub.StartSession(admin_pb2.StartSessionRequest(sid=box.sid), timeout=RPC_TIMEOUT)
    box.exchange("two")
    proc = daemon.run(["ironctl", "session", "verify", box.sid])
    assert proc.returncode == 0, out(proc)
    log = out(daemon.run(["journalctl", "-u", "ironclawd", "-n", "200", "--no-pager", "-o", "cat"]))
    assert f"moved {outdir} off the host's mount table" in log, log[-2000:]


def doctor_check(daemon: SystemdHarness) -> dict[str, object]:
    proc = daemon.run(["ironctl", "doctor", "--json"], timeout=120)
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    check: dict[str, object] = checks["outbound.namespace"]
    return check


def test_doctor_sees_a_lost_pin_before_a_restart_would_lose_the_namespace(
    daemon: SystemdHarness, test_agent: None
) -> None:
    """No session runs. The pin goes (as an operator cleaning /run might make it go): doctor
    fails the check, names what is wrong and what to do; a restart pins a namespace again."""
    check = doctor_check(daemon)
    assert check["status"] == "pass", check
    assert f"pinned at {MNTNS_PIN}" in str(check["detail"]), check
    proc = daemon.run(["umount", MNTNS_PIN])
    assert proc.returncode == 0, out(proc)
    check = doctor_check(daemon)
    assert check["status"] == "fail", check
    assert check["detail"] == f"nothing is pinned at {MNTNS_PIN}", check
    assert "restart ironclawd" in str(check["fix_hint"]), check
    restart(daemon)
    check = doctor_check(daemon)
    assert check["status"] == "pass", check
    assert "(made at start)" in str(check["detail"]), check
