"""The port behind which every MCP server an agent uses sits (docs/mcp.md).

The real adapter (``host/mcp.py`` + ``services/mcp_servers.py``) runs each stdio server in its
own hardened transient unit and talks to it with the official SDK; the unit tier uses
``tests/fakes/mcp.py``. Both pass ``tests/contract/test_mcp.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ironclawd.domain.mcp import McpServer, McpToolDef


@dataclass(frozen=True)
class McpCallResult:
    """A tool's answer as text (content blocks joined), capped by the adapter."""

    text: str
    is_error: bool = False
    truncated: bool = False


class McpClients(Protocol):
    """One live client per (agent, server); started on first use, restarted with back-off after
    a crash, never blocking the event loop. Errors: ``McpServerFailed`` (could not start,
    crashed, backing off, timed out, broke the protocol) or ``InvalidArgument``."""

    async def list_tools(self, agent: str, server: McpServer) -> tuple[McpToolDef, ...]:
        """The tools the server offers now (live definitions, not the pinned ones)."""
        ...

    async def call_tool(
        self, agent: str, server: McpServer, tool: str, arguments: dict[str, object]
    ) -> McpCallResult:
        """Call one tool with a time-out and an output cap."""
        ...

    async def stop(self, agent: str, server: str) -> None:
        """Stop the server's unit (unregistered, or the agent removed); a no-op if not running."""
        ...

    async def close(self) -> None:
        """Stop every server (daemon shut-down)."""
        ...
