"""A property-based fuzzer over every admin method and every sandbox-socket method (issue 11).

Requests are raw bytes (``request_serializer=None``): random bytes, valid protobufs garbled, and
protobufs encoded by hand with hostile field values of the right wire type (10 kB ids, NUL, lone
surrogates and invalid UTF-8, JSON nested too deep or typed wrongly, integers past int64, unknown
enum values). Every answer must carry a documented status (never UNKNOWN, never an unexpected
INTERNAL), details free of Python class names and well under gRPC's 8 KiB metadata limit; after
each method the daemon is SERVING, a control call works, and at the end ``ironctl audit verify``
is ok and the journal holds no unexpected failure. Admin calls go to the real admin socket;
sandbox calls come from a worker inside the session unit's cgroup, as the box's own would.
Examples are bounded and derandomized (the same cases every run).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, assume, given, settings

from ironclaw.admin.v1 import admin_pb2
from ironclaw.egress.v1 import egress_pb2
from ironclaw.gateway.v1 import gateway_pb2
from ironclaw.mcp.v1 import mcp_pb2
from ironclaw.model.v1 import model_pb2
from tests.harness.box_scripts import JOIN_UNIT
from tests.harness.mcp_venv import mcp_venv
from tests.harness.private_systemd import SystemdHarness
from tests.integration.protofuzz import AGENT, requests_for

pytestmark = pytest.mark.integration

SOCKET = "/run/ironclaw/admin.sock"
CONFIG = "/etc/ironclaw/ironclawd.toml"
SESSIONS = "/run/ironclaw/sessions"
# An egress grant so that egress.sock exists; 192.0.2.1 (TEST-NET-1) is never public, so the
# broker refuses every fetch before anything leaves the host.
FUZZ_CONFIG = f"[agents.{AGENT}]\negress = [{{host = '192.0.2.1', scheme = 'http'}}]\n"
DOCUMENTED = {
    "OK", "INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "FAILED_PRECONDITION",
    "RESOURCE_EXHAUSTED", "PERMISSION_DENIED", "UNAVAILABLE", "ABORTED", "DEADLINE_EXCEEDED",
    "UNIMPLEMENTED", "CANCELLED",
}  # fmt: skip
MAX_DETAILS = 1100  # api/boundary.DETAILS_CHARS plus escapes; gRPC's limit is 8 KiB
CALL_SECONDS = 5.0

ADMIN = admin_pb2.DESCRIPTOR.services_by_name["AdminService"]
SANDBOX: dict[str, ServiceDescriptor] = {
    "model": model_pb2.DESCRIPTOR.services_by_name["ModelService"],
    "gateway": gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"],
    "egress": egress_pb2.DESCRIPTOR.services_by_name["EgressService"],
    "mcp": mcp_pb2.DESCRIPTOR.services_by_name["McpService"],
}
SANDBOX_METHODS = [(sock, m) for sock, svc in SANDBOX.items() for m in svc.methods]
# Calls whose effects outlast the call (a sandbox per session) are kept to names no agent has.
SLOW = {"Doctor", "CreateSession"}

# Runs inside the private systemd: joins the session unit's cgroup (the sockets admit only it),
# then answers one JSON line per call: {"socket", "path", "stream", "data" (hex)}.
WORKER = (
    JOIN_UNIT
    + r"""
import json, os, subprocess, sys, time
import grpc
req = json.loads(sys.stdin.readline())
join_unit(req["unit"])
channels = {}
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    call = json.loads(line)
    name = call["socket"]
    if name not in channels:
        channels[name] = grpc.insecure_channel(f"unix:{req['dir']}/{name}.sock")
    ch = channels[name]
    data = bytes.fromhex(call["data"])
    for attempt in range(40):
        try:
            if call["stream"]:
                rpc = ch.unary_stream(call["path"], request_serializer=None,
                                      response_deserializer=None)
                for _ in zip(range(64), rpc(data, timeout=call["timeout"])):
                    pass
            else:
                ch.unary_unary(call["path"], request_serializer=None,
                               response_deserializer=None)(data, timeout=call["timeout"])
            answer = {"code": "OK", "details": ""}
        except grpc.RpcError as exc:
            answer = {"code": exc.code().name, "details": exc.details() or ""}
        # Paced, not flooded: [sockets] calls_per_second refuses a burst (a documented status);
        # a retry after a pause lets the call itself reach the handler.
        if answer["code"] != "RESOURCE_EXHAUSTED" or "slow down" not in answer["details"]:
            break
        time.sleep(0.05)
    print(json.dumps(answer), flush=True)
"""
)


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


def assert_documented(where: str, code: str, details: str) -> None:
    assert code in DOCUMENTED, f"{where}: {code}: {details[:300]!r}"
    assert "<class" not in details, f"{where}: {details[:300]!r}"
    assert "Traceback" not in details, f"{where}: {details[:300]!r}"
    assert len(details.encode()) <= MAX_DETAILS, f"{where}: {len(details)} chars of details"


def _call_admin(chan: grpc.Channel, method: MethodDescriptor, data: bytes) -> tuple[str, str]:
    path = f"/{ADMIN.full_name}/{method.name}"
    try:
        if method.server_streaming:
            rpc = chan.unary_stream(path, request_serializer=None, response_deserializer=None)
            for _ in zip(range(64), rpc(data, timeout=CALL_SECONDS), strict=False):
                pass
        else:
            rpc1 = chan.unary_unary(path, request_serializer=None, response_deserializer=None)
            rpc1(data, timeout=CALL_SECONDS if method.name not in SLOW else 60)
    except grpc.RpcError as exc:
        return exc.code().name, exc.details() or ""
    return "OK", ""


def _creates_a_sandbox(method: MethodDescriptor, data: bytes) -> bool:
    """A create naming an existing agent would start a real sandbox per example: left out."""
    if method.name != "CreateSession":
        return False
    try:
        request = admin_pb2.CreateSessionRequest.FromString(data)
    except DecodeError:
        return False
    return request.agent in ("demo", AGENT)


def assert_daemon_unchanged(sysd: SystemdHarness, chan: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    status = chan.unary_unary(
        f"/{ADMIN.full_name}/GetStatus",
        request_serializer=admin_pb2.GetStatusRequest.SerializeToString,
        response_deserializer=admin_pb2.GetStatusResponse.FromString,
    )(admin_pb2.GetStatusRequest(), timeout=10)
    assert status.state == "running"


def _out(proc: Any) -> str:
    return (proc.stdout or b"").decode(errors="replace") + (proc.stderr or b"").decode(
        errors="replace"
    )


def _cursor(sysd: SystemdHarness) -> str:
    proc = sysd.run(["journalctl", "-n", "0", "--show-cursor", "--no-pager"])
    return _out(proc).strip().rsplit("cursor: ", 1)[-1]


@pytest.fixture(scope="module")
def fuzzed(daemon: SystemdHarness) -> Iterator[tuple[SystemdHarness, str, str]]:
    """The daemon with an egress-granted agent, an MCP tool granted to it (mcp-server-time, so
    that mcp.sock exists), and one session of it; the journal cursor from before the fuzzing.
    At the end: the audit log verifies, no call failed unexpectedly."""
    sysd = daemon
    proc = sysd.run(["bash", "-c", f"cat > {CONFIG} <<'EOF'\n{FUZZ_CONFIG}EOF\n"
                     "systemctl restart ironclawd"])  # fmt: skip
    assert proc.returncode == 0, _out(proc)
    command = f"{mcp_venv()}/bin/mcp-server-time"
    for change in (("add", "time", "--agent", AGENT, "--command", command),
                   ("grant", "time", "get_current_time", "--agent", AGENT)):  # fmt: skip
        proc = sysd.run(["ironctl", "--json", "mcp", *change], timeout=120)
        assert proc.returncode == 0, _out(proc)
        change_id = json.loads(proc.stdout)["id"]
        proc = sysd.run(["ironctl", "change", "approve", change_id, "--yes"], timeout=120)
        assert proc.returncode == 0, _out(proc)
    sid = "fuzzsess01"
    proc = sysd.run(["ironctl", "session", "create", "--agent", AGENT, "--sid", sid], timeout=120)
    assert proc.returncode == 0, _out(proc)
    mark = _cursor(sysd)
    yield sysd, sid, mark
    sysd.run(["ironctl", "session", "rm", "--force", sid], timeout=120)
    sysd.run(["bash", "-c", f"rm -f {CONFIG}; systemctl restart ironclawd"], timeout=120)


@pytest.mark.parametrize("method", list(ADMIN.methods), ids=lambda m: m.name)
def test_admin_method_answers_hostile_requests_with_documented_statuses(
    fuzzed: tuple[SystemdHarness, str, str], method: MethodDescriptor
) -> None:
    sysd, _sid, _mark = fuzzed
    chan = grpc.insecure_channel(f"unix:{sysd.host_path(SOCKET)}")
    seen: dict[str, int] = {}

    @_settings(4 if method.name in SLOW else 20)
    @given(data=requests_for(method.input_type))
    def fuzz(data: bytes) -> None:
        assume(not _creates_a_sandbox(method, data))
        code, details = _call_admin(chan, method, data)
        seen[code] = seen.get(code, 0) + 1
        assert_documented(f"{method.name}({data[:60]!r})", code, details)

    try:
        fuzz()
        assert_daemon_unchanged(sysd, chan)
    finally:
        chan.close()
    print(f"{method.name}: {seen}")


@pytest.fixture(scope="module")
def worker(fuzzed: tuple[SystemdHarness, str, str]) -> Iterator[subprocess.Popen[str]]:
    """A process in the session unit's cgroup that makes the sandbox calls it is given."""
    sysd, sid, _mark = fuzzed
    argv = [*sysd._enter_argv(), "env", "-C", str(sysd.workdir), ".venv/bin/python", "-c", WORKER]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None
    assert proc.stdout is not None
    doc = {"unit": f"ironclaw-sbx-{sid}.service", "dir": f"{SESSIONS}/{sid}"}
    proc.stdin.write(json.dumps(doc) + "\n")
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline()) == {"ready": True}
    yield proc
    proc.stdin.close()
    proc.wait(timeout=30)
    proc.stdout.close()


@pytest.mark.parametrize(
    ("sock", "method"), SANDBOX_METHODS, ids=[f"{s}.{m.name}" for s, m in SANDBOX_METHODS]
)
def test_sandbox_method_answers_hostile_requests_with_documented_statuses(
    fuzzed: tuple[SystemdHarness, str, str],
    worker: subprocess.Popen[str],
    sock: str,
    method: MethodDescriptor,
) -> None:
    sysd, _sid, _mark = fuzzed
    assert worker.stdin is not None
    assert worker.stdout is not None
    path = f"/{method.containing_service.full_name}/{method.name}"
    seen: dict[str, int] = {}

    @_settings(20)
    @given(data=requests_for(method.input_type))
    def fuzz(data: bytes) -> None:
        call = {"socket": sock, "path": path, "stream": method.server_streaming,
                "data": data.hex(), "timeout": CALL_SECONDS}  # fmt: skip
        worker.stdin.write(json.dumps(call) + "\n")  # type: ignore[union-attr]
        worker.stdin.flush()  # type: ignore[union-attr]
        answer = json.loads(worker.stdout.readline())  # type: ignore[union-attr]
        seen[answer["code"]] = seen.get(answer["code"], 0) + 1
        assert_documented(f"{sock}.sock {method.name}({data[:60]!r})", **answer)

    fuzz()
    print(f"{sock}.{method.name}: {seen}")
    # Not every call was turned away at the door: the handlers themselves were reached.
    assert set(seen) - {"RESOURCE_EXHAUSTED"}, seen
    chan = grpc.insecure_channel(f"unix:{sysd.host_path(SOCKET)}")
    try:
        assert_daemon_unchanged(sysd, chan)
    finally:
        chan.close()


def test_after_the_fuzzing_the_audit_log_verifies_and_nothing_failed_unexpectedly(
    fuzzed: tuple[SystemdHarness, str, str],
) -> None:
    sysd, sid, mark = fuzzed
    proc = sysd.run(["ironctl", "audit", "verify", "--json"], timeout=120)
    assert proc.returncode == 0, _out(proc)
    assert json.loads(proc.stdout)["ok"] is True, _out(proc)
    journal = _out(sysd.run(["journalctl", "--no-pager", "-o", "cat", "-u", "ironclawd.service",
                             "--after-cursor", mark], timeout=60))  # fmt: skip
    assert "failed unexpectedly" not in journal
    assert "Traceback" not in journal
    # The session the box calls came from is still served.
    proc = sysd.run(["ironctl", "session", "show", sid, "--json"], timeout=60)
    assert proc.returncode == 0, _out(proc)
    assert json.loads(proc.stdout)["state"] == "running", _out(proc)
