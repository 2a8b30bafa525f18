"""MCP tool calls from inside a sandbox beside a direct SDK call to the same server, in one run.

Run inside a systemd with ironclawd installed (``make bench`` does). The server is
``mcp-server-time --local-timezone UTC`` from the test venv (scripts/mcp-test-venv); the call is
``get_current_time {"timezone": "UTC"}`` everywhere. An agent ``bench-mcp`` (mock model, the
local tool ``list_files``, rate limits out of the way) gets the server registered and the tool
granted the real way (``ironctl mcp add`` and ``ironctl mcp grant``, each approved), then one
session. Measured, the ways interleaved call by call so that drift on a shared machine hits all
alike:

- ``direct_sdk``: the official SDK's ``stdio_client`` straight to the server (no unit), one
  ClientSession;
- ``supervisor``: the daemon's McpClients (McpSupervisor over SystemdMcpLauncher: the hardened
  transient unit via ``systemd-run --pipe``, the bounded transport), in this process;
  ``supervisor_list_and_call``: the same with a tools/list first, as the gateway does per call;
- ``mcp_sock``: McpService.CallTool on the session's ``mcp.sock`` from a process joined to the
  session's unit, on the host (peer check, gRPC, the current grant, a live listing and the pin
  check, the supervisor, cap, masking, audit; no gVisor, no agent loop);
- ``sandbox_mcp_tool``: ``/tool mcp__time__get_current_time {...}`` sent to the session and the
  reply seen (what ``ironctl send`` does, minus its process start): the mock model asks for the
  tool, the agent in gVisor calls mcp.sock, the model quotes the result;
  ``sandbox_local_tool``: ``/tool list_files {}`` the same way (a tool run in the box), so the
  MCP path's own cost is the difference; ``sandbox_no_tool``: a plain message (one model turn).

Cold starts (COLD of each): a new SDK process and session; the supervisor after ``stop``; the
sandbox's first call after the daemon's server unit was stopped (``systemctl stop``).
Prints medians and writes ``results/bench-mcp.json``; no assertion on any timing. First full run
(2 shared cores, load ~4.5; median ms): direct_sdk 5.6, supervisor 5.4 (the unit costs nothing
once started), supervisor_list_and_call 9.1, mcp_sock 15.9; sandbox_mcp_tool 83.0 against
sandbox_local_tool 51.1 (no tool 40.1), so ~32 ms for an MCP call from the box, ~16 of them
host-side (the gateway's live listing for the pin check is a second round trip to the server);
cold first call 1.8 s direct, 2.7 s supervisor, 3.0 s from the box (Python start-up dominates).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import mcp_types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from benchmarks.common import DAEMON_CONFIG, SOCKET_METERS_LIFTED, daemon_config, write_doc
from benchmarks.messages import Replies
from benchmarks.stats import summary_ms
from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from ironclawd.domain.mcp import McpLimits, McpServer
from ironclawd.host.mcp import SystemdMcpLauncher, unit_name
from ironclawd.services.mcp_servers import McpSupervisor
from tests.fakes import FakeCredentials
from tests.harness.agents import unlimited_agent
from tests.harness.box_scripts import JOIN_UNIT
from tests.harness.mcp_venv import mcp_venv

ROOT = Path(__file__).resolve().parents[1]
SOCKET = "/run/ironclaw/admin.sock"
CALLS = int(os.environ.get("BENCH_CALLS", "100"))
COLD = int(os.environ.get("BENCH_MCP_COLD", "5"))
WARMUP = 5
AGENT = "bench-mcp"
IN_PROCESS_AGENT = "bench-sup"  # another unit name than the daemon's server of AGENT
TOOL, ARGS = "get_current_time", {"timezone": "UTC"}
MODEL_NAME = f"mcp__time__{TOOL}"
Timed = Callable[[], Awaitable[float]]

# A process in the session's unit (mcp.sock admits no other): one CallTool per line read,
# answering with the seconds it took. Stdin's first line: {"unit", "socket"}.
SOCK_CLIENT = (
    JOIN_UNIT
    + r"""
import json, sys, time
import grpc
from ironclaw.mcp.v1 import mcp_pb2, mcp_pb2_grpc
req = json.loads(sys.stdin.readline())
join_unit(req["unit"])
stub = mcp_pb2_grpc.McpServiceStub(grpc.insecure_channel(f"unix:{req['socket']}"))
call = mcp_pb2.CallToolRequest(name=req["name"], arguments_json=req["args"])
for _ in sys.stdin:
    t0 = time.perf_counter()
    r = stub.CallTool(call, timeout=60)
    took = time.perf_counter() - t0
    ok = not r.is_error and json.loads(r.text)["timezone"] == "UTC"
    print(took if ok else "ERR " + json.dumps(r.text), flush=True)
"""
)


def _check_time(text: str, way: str) -> None:
    if json.loads(text).get("timezone") != "UTC":
        raise SystemExit(f"bench-mcp: {way} answered {text!r}")


def _ctl(*args: str) -> dict[str, Any]:
    proc = subprocess.run(["ironctl", "--json", *args], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"bench-mcp: ironctl {' '.join(args)}: {proc.stdout}{proc.stderr}")
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def _approved(*args: str) -> None:
    """An ``ironctl mcp`` change, approved as the operator would."""
    change = _ctl("mcp", *args)
    _ctl("change", "approve", change["id"], "--yes")


async def _direct_session(stack: contextlib.AsyncExitStack, command: list[str]) -> ClientSession:
    params = StdioServerParameters(command=command[0], args=command[1:])
    read, write = await stack.enter_async_context(stdio_client(params))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    return session


async def _direct_call(session: ClientSession) -> None:
    result = await session.call_tool(TOOL, ARGS)
    if not isinstance(result, mcp_types.CallToolResult) or result.is_error:
        raise SystemExit(f"bench-mcp: direct call answered {result!r}")
    block = result.content[0]
    _check_time(block.text if isinstance(block, mcp_types.TextContent) else "{}", "direct SDK")


class Sandbox:
    """A session, driven over the admin API as ``ironctl send`` does; ``label`` names the
    benchmark in the failure message."""

    def __init__(
        self, stub: admin_pb2_grpc.AdminServiceStub, sid: str, label: str = "bench-mcp"
    ) -> None:
        self.stub, self.sid, self.label = stub, sid, label
        self.replies = Replies(stub, sid)

    def round_trip(self, text: str, expect: str) -> float:
        t0 = time.perf_counter()
        request = admin_pb2.SendMessageRequest(sid=self.sid, text=text, client_id=uuid.uuid4().hex)
        sent = self.stub.SendMessage(request, timeout=60)
        reply = self.replies.wait_for(sent.seq, timeout=120)[1].text
        took = time.perf_counter() - t0
        if not reply.startswith(expect) or "error" in reply.split("\n", 1)[0]:
            raise SystemExit(f"{self.label}: {text!r} answered {reply[:500]!r}")
        return took

    def mcp_tool(self) -> float:
        said = f"tool {MODEL_NAME} said: [untrusted result of MCP tool"
        return self.round_trip(f"/tool {MODEL_NAME} {json.dumps(ARGS)}", said)

    def local_tool(self) -> float:
        return self.round_trip("/tool list_files {}", "tool list_files said: ")

    def no_tool(self) -> float:
        return self.round_trip("how late is it?", "mock: how late is it?")


async def _sock_client(sid: str) -> tuple[asyncio.subprocess.Process, Timed]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SOCK_CLIENT, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.stdin is not None
    assert proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout
    first = {"unit": f"ironclaw-sbx-{sid}.service", "name": MODEL_NAME, "args": json.dumps(ARGS),
             "socket": f"/run/ironclaw/sessions/{sid}/mcp.sock"}  # fmt: skip
    stdin.write(json.dumps(first).encode() + b"\n")

    async def call() -> float:
        stdin.write(b"\n")
        line = (await stdout.readline()).decode().strip()
        if not line or line.startswith("ERR"):
            raise SystemExit(f"bench-mcp: mcp.sock client: {line or 'ended'}")
        return float(line)

    return proc, call


def _wait_gone(unit: str) -> None:
    """Until the unit's ``systemd-run --pipe`` has exited (then the daemon reads the EOF)."""
    needle = f"--unit={unit}".encode()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        alive = False
        for path in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                alive = alive or needle in path.read_bytes()
        if not alive:
            return
        time.sleep(0.01)
    raise SystemExit(f"bench-mcp: {unit} still has its systemd-run after 30s")


async def measure(command: list[str], sandbox: Sandbox) -> dict[str, Any]:
    server = McpServer("time", command=tuple(command))
    limits = McpLimits()
    clients = McpSupervisor(SystemdMcpLauncher(FakeCredentials(), limits), limits)
    sock_proc, via_sock = await _sock_client(sandbox.sid)
    async with contextlib.AsyncExitStack() as stack:
        session = await _direct_session(stack, command)

        async def timed(call: Callable[[], Awaitable[object]]) -> float:
            t0 = time.perf_counter()
            await call()
            return time.perf_counter() - t0

        async def supervised() -> None:
            result = await clients.call_tool(IN_PROCESS_AGENT, server, TOOL, dict(ARGS))
            _check_time(result.text, "supervisor")

        async def listed_and_supervised() -> None:
            await clients.list_tools(IN_PROCESS_AGENT, server)
            await supervised()

        ways: dict[str, Timed] = {
            "direct_sdk": lambda: timed(lambda: _direct_call(session)),
            "supervisor": lambda: timed(supervised),
            "supervisor_list_and_call": lambda: timed(listed_and_supervised),
            "mcp_sock": via_sock,
            "sandbox_mcp_tool": lambda: asyncio.to_thread(sandbox.mcp_tool),
            "sandbox_local_tool": lambda: asyncio.to_thread(sandbox.local_tool),
            "sandbox_no_tool": lambda: asyncio.to_thread(sandbox.no_tool),
        }
        samples: dict[str, list[float]] = {name: [] for name in ways}
        order = list(ways)
        for i in range(WARMUP + CALLS):
            for name in order[i % len(order) :] + order[: i % len(order)]:  # rotate who goes first
                took = await ways[name]()
                if i >= WARMUP:
                    samples[name].append(took)
        warm = {name: summary_ms(s, 3) for name, s in samples.items()}

        async def direct_cold() -> float:
            async with contextlib.AsyncExitStack() as cold_stack:
                t0 = time.perf_counter()
                await _direct_call(await _direct_session(cold_stack, command))
                # Not the SDK's shut-down (it waits up to 2 s for the server to exit).
                return time.perf_counter() - t0

        async def supervisor_cold() -> float:
            await clients.stop(IN_PROCESS_AGENT, "time")
            return await timed(supervised)

        async def sandbox_cold() -> float:
            unit = unit_name(AGENT, "time")
            await asyncio.to_thread(subprocess.run, ["systemctl", "stop", unit], check=True)
            await asyncio.to_thread(_wait_gone, unit)
            return await asyncio.to_thread(sandbox.mcp_tool)

        cold: dict[str, list[float]] = {"direct_sdk": [], "supervisor": [], "sandbox_mcp_tool": []}
        for _ in range(COLD):
            cold["direct_sdk"].append(await direct_cold())
            cold["supervisor"].append(await supervisor_cold())
            cold["sandbox_mcp_tool"].append(await sandbox_cold())
    await clients.close()
    assert sock_proc.stdin is not None
    sock_proc.stdin.close()
    await sock_proc.wait()
    return {"warm": warm, "cold": {k: summary_ms(v, 1) for k, v in cold.items()}}


def _added(warm: dict[str, dict[str, float]]) -> dict[str, float]:
    def diff(a: str, b: str) -> float:
        return round(warm[a]["median_ms"] - warm[b]["median_ms"], 3)

    return {
        "supervisor_over_direct_sdk": diff("supervisor", "direct_sdk"),
        "mcp_sock_over_direct_sdk": diff("mcp_sock", "direct_sdk"),
        "sandbox_mcp_tool_over_local_tool": diff("sandbox_mcp_tool", "sandbox_local_tool"),
    }


def main() -> int:
    if not Path(SOCKET).exists():
        raise SystemExit("bench: run inside a systemd with ironclawd installed (make bench)")
    command = [str(mcp_venv() / "bin/mcp-server-time"), "--local-timezone", "UTC"]
    previous = DAEMON_CONFIG.read_text() if DAEMON_CONFIG.exists() else ""
    # The socket meters lifted as in the model-proxy bench (benchmarks/common.py): the mcp.sock
    # client calls back to back, faster than 50 calls a second; and MCP's own per-session rate
    # (60 calls a minute) would refuse the closed loop within its first minute.
    meter = "" if "[sockets]" in previous else SOCKET_METERS_LIFTED
    if "[mcp]" not in previous:
        meter += "\n[mcp]\ncalls_per_minute = 1000000\n"
    with daemon_config(unlimited_agent(AGENT, tools=("list_files",)) + meter):
        _approved("add", "time", "--agent", AGENT, "--command", " ".join(command))
        _approved("grant", "time", TOOL, "--agent", AGENT)
        with grpc.insecure_channel(f"unix:{SOCKET}") as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)
            created = stub.CreateSession(admin_pb2.CreateSessionRequest(agent=AGENT), timeout=60)
            sid = created.session.sid
            sandbox = Sandbox(stub, sid)
            try:
                results = asyncio.run(measure(command, sandbox))
            finally:
                sandbox.replies.close()
                stub.RemoveSession(admin_pb2.RemoveSessionRequest(sid=sid, force=True), timeout=60)
    report = {"calls": CALLS, "cold_starts": COLD, "server": "mcp-server-time 2026.10.19",
              **results, "added_median_ms": _added(results["warm"])}  # fmt: skip
    out = write_doc("mcp", report)
    print(f"MCP get_current_time, {CALLS} calls each, interleaved (median / p90 ms):")
    for name, s in results["warm"].items():
        print(f"  {name:<26} {s['median_ms']:>9} {s['p90_ms']:>9}")
    print(f"cold start, first call (median of {COLD}, ms):")
    for name, s in results["cold"].items():
        print(f"  {name:<26} {s['median_ms']:>9}")
    print(
        "added (median ms): " + ", ".join(f"{k} {v}" for k, v in report["added_median_ms"].items())
    )
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
