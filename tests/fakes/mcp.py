"""MCP fakes for the unit tier.

``FakeMcpClients`` stands in for the whole ``McpClients`` port: each registered server name
offers the tools a test gives it, and calls run the test's Python function. It keeps the real
adapter's contract (tests/contract/test_mcp.py): definitions sorted by name, text capped with
``truncated``, a tool error as ``is_error``, an unknown command as ``McpServerFailed``.

``LocalLauncher`` is a ``McpLauncher`` without systemd: it runs the server's argv as a plain
child of the test (through host/mcp.py's bounded transport), so the supervisor's time-outs,
back-off and caps are tested against real SDK servers without a private systemd. It keeps the
real launcher's contract (tests/contract/test_mcp_launcher.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from ironclawd.domain.kinds.mcp import tool_def
from ironclawd.domain.mcp import McpServer, McpToolDef
from ironclawd.errors import McpServerFailed, NotFound
from ironclawd.host.mcp import bounded_stdio
from ironclawd.ports import Credentials
from ironclawd.ports.mcp import McpCallResult, McpTransport

Tool = Callable[[dict[str, object]], str]


@dataclass
class FakeTool:
    description: str
    schema: dict[str, object]
    run: Tool


@dataclass
class FakeMcpClients:
    """Servers by the first word of their command (``/fake/<name>``) -> tools."""

    servers: dict[str, dict[str, FakeTool]] = field(default_factory=dict)
    max_output_bytes: int = 256 * 1024
    calls: list[tuple[str, str, str, dict[str, object]]] = field(default_factory=list)
    running: set[tuple[str, str]] = field(default_factory=set)

    def _tools(self, agent: str, server: McpServer) -> dict[str, FakeTool]:
        program = server.command[0] if server.command else ""
        tools = self.servers.get(os.path.basename(program))
        if tools is None:
            raise McpServerFailed(
                f"MCP server {server.name} of agent {agent} did not start: no such program "
                f"{program}"
            )
        self.running.add((agent, server.name))
        return tools

    async def list_tools(self, agent: str, server: McpServer) -> tuple[McpToolDef, ...]:
        tools = self._tools(agent, server)
        return tuple(tool_def(name, t.description, t.schema) for name, t in sorted(tools.items()))

    async def call_tool(
        self, agent: str, server: McpServer, tool: str, arguments: dict[str, object]
    ) -> McpCallResult:
        tools = self._tools(agent, server)
        self.calls.append((agent, server.name, tool, arguments))
        if tool not in tools:
            return McpCallResult(text=f"MCP error from {server.name}: Unknown tool: {tool}",
                                 is_error=True)  # fmt: skip
        try:
            text, is_error = tools[tool].run(arguments), False
        except Exception as exc:
            text, is_error = f"Error executing tool {tool}: {exc}", True
        data = text.encode()
        if len(data) > self.max_output_bytes:
            cut = data[: self.max_output_bytes].decode("utf-8", "ignore")
            return McpCallResult(text=cut, is_error=is_error, truncated=True)
        return McpCallResult(text=text, is_error=is_error)

    async def stop(self, agent: str, server: str) -> None:
        self.running.discard((agent, server))

    async def close(self) -> None:
        self.running.clear()


@dataclass
class LocalLauncher:
    """Runs each server's argv directly (no unit), counting starts per (agent, server). The
    server's environment is PATH, ``env``, its own ``env`` and its credentials; ``stop`` kills
    a running server's whole process group, as stopping its unit does. It and the real
    launcher pass tests/contract/test_mcp_launcher.py."""

    max_message_bytes: int = 4 * 1024 * 1024
    env: dict[str, str] = field(default_factory=dict)
    credentials: Credentials | None = None
    starts: dict[tuple[str, str], int] = field(default_factory=dict)
    opened: list[tuple[str, McpServer]] = field(default_factory=list)
    running: dict[tuple[str, str], int] = field(default_factory=dict)  # -> process group

    @contextlib.asynccontextmanager
    async def open(self, agent: str, server: McpServer) -> AsyncIterator[McpTransport]:
        if not server.command:
            raise McpServerFailed(f"MCP server {server.name} has no command to run")
        key = (agent, server.name)
        self.starts[key] = self.starts.get(key, 0) + 1
        self.opened.append((agent, server))
        secrets = {env: self._credential(name) for env, name in server.credentials}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.env, **dict(server.env),
               **secrets}  # fmt: skip
        async with bounded_stdio(
            server.command, max_message_bytes=self.max_message_bytes, env=env
        ) as transport:
            self.running[key] = transport.pid
            try:
                yield transport
            finally:
                if self.running.get(key) == transport.pid:
                    del self.running[key]

    def _credential(self, name: str) -> str:
        if self.credentials is None:
            raise NotFound(f"credential '{name}' not found")
        return self.credentials.get(name)

    async def stop(self, agent: str, server: str) -> None:
        group = self.running.pop((agent, server), None)
        if group is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)

    async def stop_all(self) -> None:
        for agent, server in list(self.running):
            await self.stop(agent, server)
