"""The MCP launcher port (``McpLauncher``): the fake (tests/fakes/mcp.py ``LocalLauncher``, the
server as a plain child) and the real ``SystemdMcpLauncher`` (host/mcp.py, a hardened transient
unit per agent and server) start the same server the same way: it speaks MCP over what
``open`` yields; it sees its own environment and credentials and nothing of the daemon's;
``stop`` ends it while it runs; a server without a command or with a missing credential is
refused before anything starts.

Both run the hostile test server (tests/harness/mcp_hostile.py, the official SDK). The real
one runs only under ``--real-host`` inside the private systemd (tests/integration/
test_contracts_real.py), with the server beside the MCP test venv: a checkout below /root or
/home is hidden from the units."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession

from ironclawd.domain.mcp import McpLimits, McpServer
from ironclawd.errors import McpServerFailed, NotFound
from ironclawd.host.mcp import SystemdMcpLauncher
from ironclawd.ports.mcp import McpLauncher, McpTransport
from tests.fakes.host import FakeCredentials
from tests.fakes.mcp import LocalLauncher
from tests.harness.mcp_venv import mcp_venv

pytestmark = pytest.mark.anyio
HOSTILE = Path(__file__).resolve().parents[1] / "harness" / "mcp_hostile.py"
AGENT = "agent-c"
TOKEN = "contract-token-value"
WAIT = 60.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def launcher(
    host_impl: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[McpLauncher, tuple[str, str]]]:
    """The launcher and the hostile server's command."""
    # Something of the daemon's own environment that no server may see.
    monkeypatch.setenv("IRONCLAW_CONTRACT_DAEMON_ONLY", "daemon")
    credentials = FakeCredentials(tok=TOKEN)
    real: McpLauncher
    if host_impl == "fake":
        real, command = LocalLauncher(credentials=credentials), (sys.executable, str(HOSTILE))
    else:
        venv = mcp_venv()
        script = venv / "mcp_hostile.py"
        shutil.copyfile(HOSTILE, script)
        os.chmod(script, 0o644)
        limits = McpLimits(connect_timeout_seconds=WAIT)
        real, command = SystemdMcpLauncher(credentials, limits), (
            str(venv / "bin" / "python3"), str(script))  # fmt: skip
    try:
        yield real, command
    finally:
        await real.stop_all()


async def _call(transport: McpTransport, tool: str, **arguments: Any) -> str:
    with anyio.fail_after(WAIT):
        async with ClientSession(transport.read, transport.write) as session:
            await session.initialize()
            result = await session.call_tool(tool, arguments)
    (content,) = result.content
    text = getattr(content, "text", None)
    assert isinstance(text, str), result
    return text


async def test_a_started_server_speaks_mcp_over_what_open_yields(
    launcher: tuple[McpLauncher, tuple[str, str]],
) -> None:
    launch, command = launcher
    server = McpServer("echoer", command=command)
    async with launch.open(AGENT, server) as transport:
        with anyio.fail_after(WAIT):
            async with ClientSession(transport.read, transport.write) as session:
                await session.initialize()
                names = [t.name for t in (await session.list_tools()).tools]
                answer = await session.call_tool("echo", {"text": "hello"})
        assert not transport.ended()
    assert "echo" in names
    assert [getattr(c, "text", None) for c in answer.content] == ["hello"]


async def test_the_server_sees_its_env_and_credentials_and_nothing_of_the_daemons(
    launcher: tuple[McpLauncher, tuple[str, str]],
) -> None:
    launch, command = launcher
    server = McpServer("envy", command=command, env=(("HOSTILE_SETTING", "on"),),
                       credentials=(("TOKEN", "tok"),))  # fmt: skip
    seen = {}
    for name in ("HOSTILE_SETTING", "TOKEN", "IRONCLAW_CONTRACT_DAEMON_ONLY"):
        async with launch.open(AGENT, server) as transport:
            seen[name] = await _call(transport, "env", name=name)
    assert seen == {"HOSTILE_SETTING": "on", "TOKEN": TOKEN, "IRONCLAW_CONTRACT_DAEMON_ONLY": ""}


async def test_stop_ends_a_running_server_and_a_second_stop_is_nothing(
    launcher: tuple[McpLauncher, tuple[str, str]],
) -> None:
    launch, command = launcher
    server = McpServer("stopped", command=command)
    async with launch.open(AGENT, server) as transport:
        assert await _call(transport, "echo", text="up") == "up"
        await launch.stop(AGENT, server.name)
        with anyio.fail_after(WAIT):
            while not transport.ended():  # noqa: ASYNC110 (the transport announces nothing)
                await anyio.sleep(0.05)
    await launch.stop(AGENT, server.name)
    await launch.stop_all()


async def test_a_server_without_a_command_or_a_credential_is_refused_before_it_starts(
    launcher: tuple[McpLauncher, tuple[str, str]],
) -> None:
    launch, command = launcher
    with pytest.raises(McpServerFailed, match="MCP server empty has no command to run"):
        async with launch.open(AGENT, McpServer("empty", command=())):
            pass
    lacking = McpServer("lacking", command=command, credentials=(("TOKEN", "absent"),))
    with pytest.raises(NotFound, match="credential 'absent' not found"):
        async with launch.open(AGENT, lacking):
            pass
