"""The MCP server port (``McpClients``): the fake (tests/fakes/mcp.py) and the real adapter
(services/mcp_servers.py over host/mcp.py: a hardened transient unit per server, the official
SDK) answer alike, the real one speaking to the real ``mcp-server-time`` from PyPI. The real one
runs only under ``--real-host`` inside the private systemd (tests/integration/
test_contracts_real.py), like the other adapters that need systemd."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from ironclawd.domain.mcp import McpLimits, McpServer
from ironclawd.errors import McpServerFailed
from ironclawd.host.mcp import SystemdMcpLauncher
from ironclawd.ports.mcp import McpClients
from ironclawd.services.mcp_servers import McpSupervisor
from tests.fakes.host import FakeCredentials
from tests.fakes.mcp import FakeMcpClients, FakeTool
from tests.harness.mcp_venv import mcp_venv

pytestmark = pytest.mark.anyio
TZ_SCHEMA: dict[str, object] = {"type": "object", "properties": {"timezone": {"type": "string"}},
             "required": ["timezone"]}  # fmt: skip


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _now(args: dict[str, object]) -> str:
    if args.get("timezone") != "UTC":
        raise ValueError(f"Invalid timezone: {args.get('timezone')}")
    return json.dumps({"timezone": "UTC", "datetime": datetime.now(UTC).isoformat()})


def _fake() -> tuple[McpClients, McpServer]:
    clients = FakeMcpClients(servers={"mcp-server-time": {
        "get_current_time": FakeTool("Get the current time.", TZ_SCHEMA, _now),
        "convert_time": FakeTool("Convert a time.", {"type": "object"}, lambda a: "{}"),
    }})  # fmt: skip
    return clients, McpServer("time", command=("/fake/mcp-server-time",))


def _real() -> tuple[McpClients, McpServer]:
    limits = McpLimits(connect_timeout_seconds=60.0)
    clients = McpSupervisor(SystemdMcpLauncher(FakeCredentials(), limits), limits)
    exe = str(mcp_venv() / "bin" / "mcp-server-time")
    return clients, McpServer("time", command=(exe, "--local-timezone", "UTC"))


@pytest.fixture
async def time_server(host_impl: str) -> AsyncIterator[tuple[McpClients, McpServer]]:
    clients, server = _fake() if host_impl == "fake" else _real()
    try:
        yield clients, server
    finally:
        await clients.close()


async def test_tools_are_listed_sorted_with_canonical_schemas_and_called(
    time_server: tuple[McpClients, McpServer],
) -> None:
    clients, server = time_server
    tools = await clients.list_tools("contract", server)
    assert [t.name for t in tools] == ["convert_time", "get_current_time"]
    now = next(t for t in tools if t.name == "get_current_time")
    assert json.loads(now.input_schema)["properties"]["timezone"]["type"] == "string"
    assert now.input_schema == json.dumps(json.loads(now.input_schema), sort_keys=True,
                                          separators=(",", ":"), ensure_ascii=False)  # fmt: skip
    result = await clients.call_tool("contract", server, "get_current_time", {"timezone": "UTC"})
    assert not result.is_error, result.text
    assert not result.truncated
    assert json.loads(result.text)["timezone"] == "UTC"
    # A tool's own failure and an unknown tool are answers, not a broken server.
    bad = await clients.call_tool("contract", server, "get_current_time", {"timezone": "Nowhere"})
    assert bad.is_error
    unknown = await clients.call_tool("contract", server, "rm_rf", {})
    assert unknown.is_error
    # Stopped, then started again on the next use.
    await clients.stop("contract", server.name)
    again = await clients.call_tool("contract", server, "get_current_time", {"timezone": "UTC"})
    assert not again.is_error


async def test_a_server_that_cannot_start_fails_naming_it(
    time_server: tuple[McpClients, McpServer],
) -> None:
    clients, _ = time_server
    missing = McpServer("gone", command=("/nonexistent/mcp-server",))
    with pytest.raises(McpServerFailed, match="gone"):
        await clients.list_tools("contract", missing)
    await clients.stop("contract", "gone")
