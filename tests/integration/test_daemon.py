"""ironclawd.service under a real (private) systemd, reached over its real admin socket."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

pytestmark = pytest.mark.integration

SOCKET = "/run/ironclaw/admin.sock"
CONFIG = "/etc/ironclaw/ironclawd.toml"


def sh(sysd: Any, script: str, **kwargs: Any) -> Any:
    return sysd.run(["bash", "-c", script], **kwargs)


def out(proc: Any) -> str:
    return (proc.stdout or b"").decode() + (proc.stderr or b"").decode()


@pytest.fixture
def restore(daemon: Any) -> Iterator[None]:
    """Put the daemon back to a clean, running state after a test that disturbs it."""
    yield
    proc = sh(
        daemon, f"rm -f {CONFIG}; systemctl reset-failed ironclawd; systemctl restart ironclawd"
    )
    assert proc.returncode == 0, out(proc)


def channel(sysd: Any) -> grpc.Channel:
    return grpc.insecure_channel(f"unix:{sysd.host_path(SOCKET)}")


def journal_since(sysd: Any, cursor: str) -> str:
    return out(sysd.run(["journalctl", "--no-pager", "-o", "cat", "--after-cursor", cursor]))


def cursor(sysd: Any) -> str:
    proc = sysd.run(["journalctl", "-n", "0", "--show-cursor", "--no-pager"])
    return out(proc).strip().rsplit("cursor: ", 1)[-1]


def show(sysd: Any, *props: str) -> dict[str, str]:
    args = [f"-p{p}" for p in props]
    text = out(sysd.run(["systemctl", "show", "ironclawd.service", *args]))
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_runs_as_notify_unit_with_status(daemon: Any) -> None:
    props = show(daemon, "Type", "ActiveState", "StatusText", "WatchdogUSec", "NotifyAccess")
    assert props["Type"] == "notify"
    assert props["ActiveState"] == "active"
    assert props["StatusText"].startswith("serving admin API on /run/ironclaw/admin.sock")
    assert props["WatchdogUSec"] == "30s"


def test_socket_permissions(daemon: Any) -> None:
    text = out(sh(daemon, f"stat -c '%a %U %G %F' {SOCKET} /run/ironclaw/internal"))
    assert "660 root ironclaw-admin socket" in text
    assert "700 root root directory" in text


def test_reflection_lists_admin_and_health(daemon: Any) -> None:
    with channel(daemon) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        replies = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
    names = {s.name for s in replies[0].list_services_response.service}
    assert {"ironclaw.admin.v1.AdminService", "grpc.health.v1.Health"} <= names


def test_health_is_serving(daemon: Any) -> None:
    with channel(daemon) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for service in ("", "ironclaw.admin.v1.AdminService"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_doctor_json_reports_every_check(daemon: Any) -> None:
    proc = daemon.run(["ironctl", "doctor", "--json"], timeout=120)
    doc = json.loads(proc.stdout)
    checks = {c["name"]: c for c in doc["checks"]}
    expected = {
        "config.file",
        "admin.socket",
        "systemd.dbus",
        "cgroup.layout",
        "netns.create",
        "sqlcipher",
        "outbound.namespace",
        "runsc.version",
        "runsc.platform",
        "runsc.platform.ptrace",
    }
    assert expected <= set(checks), sorted(checks)
    for check in checks.values():
        assert check["status"] in {"pass", "warn", "fail", "skip"}, check
        if check["status"] == "fail":
            assert check["fix_hint"], check
    assert checks["systemd.dbus"]["status"] == "pass"
    assert checks["outbound.namespace"]["status"] == "pass"
    assert checks["runsc.platform.ptrace"]["status"] == "pass"
    assert (proc.returncode == 0) == doc["ok"]


def test_message_size_limit_applies(daemon: Any) -> None:
    with channel(daemon) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        huge = reflection_pb2.ServerReflectionRequest(file_containing_symbol="x" * (5 << 20))
        with pytest.raises(grpc.RpcError) as info:
            list(stub.ServerReflectionInfo(iter([huge]), timeout=10))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_malformed_config_fails_start_and_journal_names_key(daemon: Any, restore: None) -> None:
    mark = cursor(daemon)
    sh(daemon, f"printf '[admin]\\nmax_mesage_bytes = 4096\\n' > {CONFIG}")
    proc = daemon.run(["systemctl", "restart", "ironclawd.service"], timeout=60)
    assert proc.returncode != 0
    props = show(daemon, "ActiveState", "Result", "ExecMainStatus")
    assert props["ActiveState"] == "failed"
    assert props["ExecMainStatus"] == "78"
    log = journal_since(daemon, mark)
    assert "unknown key 'admin.max_mesage_bytes'" in log
    assert "did you mean 'max_message_bytes'" in log
    # Nothing was bound before the refusal.
    assert daemon.run(["test", "-e", SOCKET]).returncode != 0


def test_bad_config_on_reload_keeps_the_daemon_serving(daemon: Any, restore: None) -> None:
    mark = cursor(daemon)
    sh(daemon, f"printf '[sandbox]\\nplatform = \"warp\"\\n' > {CONFIG}")
    assert daemon.run(["systemctl", "reload", "ironclawd.service"]).returncode == 0
    assert show(daemon, "ActiveState")["ActiveState"] == "active"
    assert "bad value for 'sandbox.platform'" in journal_since(daemon, mark)
    assert daemon.run(["ironctl", "status"]).returncode == 0


def test_sigterm_stops_cleanly(daemon: Any, restore: None) -> None:
    assert daemon.run(["systemctl", "stop", "ironclawd.service"]).returncode == 0
    props = show(daemon, "ActiveState", "Result")
    assert props == {"ActiveState": "inactive", "Result": "success"}
    assert daemon.run(["test", "-e", SOCKET]).returncode != 0
    proc = daemon.run(["ironctl", "status"])
    assert proc.returncode == 3
    assert b"does not exist" in proc.stderr


def test_refuses_symlink_at_socket_path(daemon: Any, restore: None) -> None:
    before = out(daemon.run(["sha256sum", "/etc/shadow"]))
    sh(daemon, f"systemctl stop ironclawd; ln -sf /etc/shadow {SOCKET}")
    mark = cursor(daemon)
    assert daemon.run(["systemctl", "start", "ironclawd.service"]).returncode != 0
    assert f"refusing to replace {SOCKET}: a symlink" in journal_since(daemon, mark)
    assert out(daemon.run(["sha256sum", "/etc/shadow"])) == before
    sh(daemon, f"rm -f {SOCKET}")


def test_non_member_is_refused_by_the_socket(daemon: Any) -> None:
    proc = daemon.run(["ironctl", "status", "--json"], user="outsider")
    assert proc.returncode == 4, out(proc)
    error = json.loads(proc.stdout)["error"]
    assert "not in group 'ironclaw-admin'" in error["message"]


def test_non_member_is_refused_by_peer_credentials_too(daemon: Any, restore: None) -> None:
    """Even if the socket's mode were opened up, the kernel's answer decides."""
    mark = cursor(daemon)
    sh(daemon, f"chmod 0666 {SOCKET}")
    proc = daemon.run(["ironctl", "status", "--json"], user="outsider")
    assert proc.returncode == 4, out(proc)
    error = json.loads(proc.stdout)["error"]
    assert error["code"] == "PERMISSION_DENIED"
    assert "(outsider)" in error["message"]
    uid = out(daemon.run(["id", "-u", "outsider"])).strip()
    assert f"refused: uid {uid} (outsider)" in journal_since(daemon, mark)


SPOOF_CLIENT = textwrap.dedent(
    """
    import json, sys, grpc
    from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
    claims = [("x-ironclaw-uid", "0"), ("x-user", "root"), ("authorization", "uid=0")]
    with grpc.insecure_channel("unix:/run/ironclaw/admin.sock") as ch:
        reply = admin_pb2_grpc.AdminServiceStub(ch).GetStatus(
            admin_pb2.GetStatusRequest(), metadata=claims, timeout=10)
    try:
        import socket
        s = socket.socket(socket.AF_UNIX)
        s.connect("/run/ironclaw/internal/admin-grpc.sock")
        internal = "connected"
    except OSError as exc:
        internal = type(exc).__name__
    print(json.dumps({"uid": reply.caller.uid, "name": reply.caller.user_name,
                      "internal": internal}))
    """
)


def test_member_cannot_claim_another_identity(daemon: Any) -> None:
    mark = cursor(daemon)
    uid = int(out(daemon.run(["id", "-u", "alice"])).strip())
    proc = daemon.run([".venv/bin/python", "-c", SPOOF_CLIENT], user="alice")
    assert proc.returncode == 0, out(proc)
    seen = json.loads(proc.stdout)
    assert seen == {"uid": uid, "name": "alice", "internal": "PermissionError"}
    log = journal_since(daemon, mark)
    assert f"GetStatus by uid {uid} (alice)" in log
    assert "by uid 0" not in log


def test_member_is_served(daemon: Any) -> None:
    proc = daemon.run(["ironctl", "status", "--json"], user="alice")
    assert proc.returncode == 0, out(proc)
    assert json.loads(proc.stdout)["caller"]["user_name"] == "alice"


def test_every_call_records_the_callers_uid_in_the_journal(daemon: Any) -> None:
    assert daemon.run(["ironctl", "status"]).returncode == 0
    proc = daemon.run(["journalctl", "-u", "ironclawd", "-n", "20", "-o", "json", "--no-pager"])
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    calls = [r for r in records if r.get("IRONCLAW_METHOD", "").endswith("/GetStatus")]
    assert calls, "no structured admin-call record in the journal"
    assert calls[-1]["IRONCLAW_CALLER_UID"] == "0"


def test_mcp_server_units_an_earlier_run_left_are_stopped_after_ready(daemon: Any) -> None:
    """The start's sweep (services/mcp_servers.py ``sweep``) runs after READY and stops every
    ``ironclaw-mcp-*`` unit it finds; a unit of another name is left alone."""
    leftover, other = "ironclaw-mcp-leftover_srv.service", "ironclaw-other-sweep.service"
    for unit in (leftover, other):
        proc = daemon.run(["systemd-run", f"--unit={unit}", "--property=Type=exec",
                           "/bin/sleep", "600"])  # fmt: skip
        assert proc.returncode == 0, out(proc)
    try:
        mark = cursor(daemon)
        assert daemon.run(["systemctl", "restart", "ironclawd"]).returncode == 0  # at READY
        # Until the stop has ended, not only begun: "deactivating" is not active either (CI
        # saw the loop end on it once, stop 49).
        proc = sh(daemon, f"for i in $(seq 100); do case $(systemctl is-active {leftover}) in "
                          f"inactive|failed) break;; esac; sleep 0.1; done; "
                          f"systemctl is-active {leftover} {other}")  # fmt: skip
        assert out(proc).split()[:2] == ["inactive", "active"], out(proc)
        for _ in range(50):  # the journal may get the lines after the unit is inactive
            lines = journal_since(daemon, mark).splitlines()
            if any(line.startswith(f"Stopped {leftover}") for line in lines):
                break
            time.sleep(0.1)
        ready = next(i for i, line in enumerate(lines) if " ready: serving admin API" in line)
        stopped = next(i for i, line in enumerate(lines)
                       if line.startswith(f"Stopped {leftover}"))  # fmt: skip
        assert stopped > ready, lines
    finally:
        daemon.run(["systemctl", "stop", leftover, other])
