"""The MCP supervisor (services/mcp_servers.py) over real SDK servers run as plain children
(tests/fakes/mcp.py LocalLauncher; the hardened unit: test_mcp_host.py):
time-outs, the output and message caps, crash and hang recovery with back-off, and that one
server's trouble never holds up another's calls or the event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ironclawd.domain.mcp import McpLimits, McpServer
from ironclawd.errors import McpServerFailed
from ironclawd.services.mcp_servers import McpSupervisor
from tests.fakes.mcp import LocalLauncher

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

HOSTILE = str(Path(__file__).resolve().parents[1] / "harness" / "mcp_hostile.py")
SERVER = McpServer("hostile", command=(sys.executable, HOSTILE))
LIMITS = McpLimits(
    connect_timeout_seconds=20.0, list_timeout_seconds=10.0, call_timeout_seconds=2.0,
    max_output_bytes=1000, max_message_bytes=1024 * 1024,
    backoff_initial_seconds=0.5, backoff_max_seconds=2.0,
)  # fmt: skip


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def supervisor() -> AsyncIterator[tuple[McpSupervisor, LocalLauncher]]:
    launcher = LocalLauncher(max_message_bytes=LIMITS.max_message_bytes)
    clients = McpSupervisor(launcher, LIMITS)
    try:
        yield clients, launcher
    finally:
        await clients.close()


async def test_tools_are_listed_and_called_over_one_session(
    supervisor: tuple[McpSupervisor, LocalLauncher],
) -> None:
    clients, launcher = supervisor
    tools = await clients.list_tools("a", SERVER)
    assert [t.name for t in tools] == [
        "big",
        "connect",
        "crash",
        "echo",
        "env",
        "hang",
        "read",
        "write",
    ]
    result = await clients.call_tool("a", SERVER, "echo", {"text": "hi"})
    assert (result.text, result.is_error, result.truncated) == ("hi", False, False)
    unknown = await clients.call_tool("a", SERVER, "nope", {})
    assert unknown.is_error
    assert "nope" in unknown.text
    assert launcher.starts == {("a", "hostile"): 1}


async def test_output_over_the_cap_is_cut_and_flagged_and_a_huge_message_restarts(
    supervisor: tuple[McpSupervisor, LocalLauncher],
) -> None:
    clients, launcher = supervisor
    small = await clients.call_tool("a", SERVER, "big", {"megabytes": 0})
    assert small.text == ""
    # 2 MB is over the 1 MiB message cap: the server is stopped, the call fails with why.
    with pytest.raises(McpServerFailed, match=r"message over 1048576 bytes"):
        await clients.call_tool("a", SERVER, "big", {"megabytes": 2})
    await asyncio.sleep(LIMITS.backoff_initial_seconds)
    text = "é" * 600  # 1200 bytes of UTF-8: cut at 1000 on a character boundary
    cut = await clients.call_tool("a", SERVER, "echo", {"text": text})
    assert cut.truncated
    assert cut.text == "é" * 500
    assert launcher.starts[("a", "hostile")] == 2


async def test_a_hung_server_times_out_without_holding_up_another_agents_server(
    supervisor: tuple[McpSupervisor, LocalLauncher],
) -> None:
    clients, _ = supervisor
    await clients.list_tools("a", SERVER)
    await clients.list_tools("b", SERVER)
    hung = asyncio.create_task(clients.call_tool("a", SERVER, "hang", {}))
    # While a's server hangs, b's answers at once and the event loop keeps ticking.
    started = time.monotonic()
    for _ in range(5):
        assert (await clients.call_tool("b", SERVER, "echo", {"text": "ok"})).text == "ok"
    assert time.monotonic() - started < LIMITS.call_timeout_seconds
    assert not hung.done()
    with pytest.raises(McpServerFailed, match=r"did not answer calling hang within 2s"):
        await hung
    # Held off, then started afresh.
    with pytest.raises(McpServerFailed, match=r"not restarted for another"):
        await clients.call_tool("a", SERVER, "echo", {"text": "x"})
    await asyncio.sleep(LIMITS.backoff_initial_seconds)
    assert (await clients.call_tool("a", SERVER, "echo", {"text": "back"})).text == "back"


async def test_a_crash_mid_call_is_reported_and_the_server_restarts(
    supervisor: tuple[McpSupervisor, LocalLauncher],
) -> None:
    clients, launcher = supervisor
    with pytest.raises(McpServerFailed, match="failed"):
        await clients.call_tool("a", SERVER, "crash", {})
    await asyncio.sleep(LIMITS.backoff_initial_seconds)
    assert (await clients.call_tool("a", SERVER, "echo", {"text": "again"})).text == "again"
    assert launcher.starts[("a", "hostile")] == 2


async def test_a_server_crashing_at_every_start_backs_off_exponentially_up_to_the_cap() -> None:
    now = [1000.0]
    launcher = LocalLauncher(env={"HOSTILE_MODE": "crash"})
    clients = McpSupervisor(launcher, LIMITS, monotonic=lambda: now[0])
    try:
        delays = []
        for _ in range(4):
            with pytest.raises(McpServerFailed, match="did not start"):
                await clients.list_tools("a", SERVER)
            with pytest.raises(
                McpServerFailed, match=r"failed \d time\(s\).*not restarted for"
            ) as e:
                await clients.list_tools("a", SERVER)
            delays.append(float(str(e.value).rsplit("another ", 1)[1].rstrip("s")))
            now[0] += 10.0
        assert delays == [0.5, 1.0, 2.0, 2.0]
        assert launcher.starts[("a", "hostile")] == 4
    finally:
        await clients.close()


async def test_a_missing_program_fails_with_the_reason_and_stop_is_idempotent(
    supervisor: tuple[McpSupervisor, LocalLauncher],
) -> None:
    clients, _ = supervisor
    missing = McpServer("gone", command=("/nonexistent/mcp-server",))
    with pytest.raises(McpServerFailed, match="cannot start /nonexistent/mcp-server"):
        await clients.list_tools("a", missing)
    await clients.stop("a", "gone")
    await clients.stop("a", "never-started")


async def test_concurrent_callers_of_a_hung_server_cause_one_restart_not_a_unit_race(
    supervisor: tuple[McpSupervisor, LocalLauncher],
) -> None:
    clients, launcher = supervisor
    calls = [clients.call_tool("a", SERVER, "hang", {}) for _ in range(3)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, McpServerFailed) for r in results), results
    # One failure counted (the hold-off is the first step, 0.5 s), one server stopped.
    with pytest.raises(McpServerFailed, match=r"failed 1 time\(s\)"):
        await clients.call_tool("a", SERVER, "echo", {"text": "x"})
    await asyncio.sleep(LIMITS.backoff_initial_seconds)
    assert (await clients.call_tool("a", SERVER, "echo", {"text": "y"})).text == "y"
    assert launcher.starts[("a", "hostile")] == 2
    assert clients.running() == [("a", "hostile")]


async def test_a_probe_runs_without_credentials_or_network_and_leaves_nothing_running(
    supervisor: tuple[McpSupervisor, LocalLauncher],
) -> None:
    clients, launcher = supervisor
    server = dataclasses.replace(SERVER, credentials=(("TOKEN", "tok"),), allow=("h.example:443",))
    tools = await clients.probe("a", server)
    assert "echo" in [t.name for t in tools]
    ((agent, started),) = launcher.opened
    assert agent.startswith("probe-")
    assert (started.credentials, started.allow) == ((), ())
    assert clients.running() == []


async def test_unregistered_and_re_registered_servers_stop_and_restart(
    supervisor: tuple[McpSupervisor, LocalLauncher],
) -> None:
    clients, launcher = supervisor
    other = dataclasses.replace(SERVER, name="other")
    await clients.list_tools("a", SERVER)
    await clients.list_tools("a", other)
    await clients.list_tools("b", SERVER)
    await clients.forget_unregistered("a", [other])
    assert clients.running() == [("a", "other"), ("b", "hostile")]
    # Another environment is another server: the next use starts it afresh.
    changed = dataclasses.replace(other, env=(("X", "1"),))
    await clients.forget_unregistered("a", [changed])
    assert clients.running() == [("b", "hostile")]
    assert (await clients.call_tool("a", changed, "env", {"name": "X"})).text == "1"
    assert launcher.starts[("a", "other")] == 2
