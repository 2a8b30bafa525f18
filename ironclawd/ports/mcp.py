"""The port behind which every MCP server an agent uses sits (docs/mcp.md).

The real adapter (``host/mcp.py`` + ``services/mcp_servers.py``) runs each stdio server in its
own hardened transient unit and talks to it with the official SDK; the unit tier uses
``tests/fakes/mcp.py``. Both pass ``tests/contract/test_mcp.py``.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ironclawd.domain.mcp import McpServer, McpToolDef

if TYPE_CHECKING:  # the SDK costs ~0.2 s to import: not on the daemon's start path (issue 17)
    from mcp.client._transport import ReadStream, WriteStream
    from mcp.shared.message import SessionMessage


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


@dataclass
class McpTransport:
    """A running server's two ends, as the SDK's ``ClientSession`` takes them."""

    read: ReadStream[SessionMessage | Exception]
    write: WriteStream[SessionMessage]

    def why(self) -> str:
        """Why the server stopped answering, as far as the launcher knows ("" if it does not)."""
        return ""

    def ended(self) -> bool:
        """Whether the server's output has ended (it exited, or its transport was cut)."""
        return False

    def over_cap(self) -> str | None:
        """The JSON-RPC id (as text) of the request whose answer went over
        ``max_message_bytes`` and ended the transport, if the launcher could tell; else None."""
        return None


class McpLauncher(Protocol):
    """Starts one server of one agent where it runs (real: ``host/mcp.py``, a hardened
    transient unit per (agent, server)); the supervisor (``services/mcp_servers.py``) speaks MCP
    over what it yields."""

    def open(self, agent: str, server: McpServer) -> AbstractAsyncContextManager[McpTransport]:
        """The server started; leaving the context stops it (its whole unit). McpServerFailed
        if it cannot be started."""
        ...

    async def stop(self, agent: str, server: str) -> None:
        """Stop the server's unit if one is running (also one left by an earlier daemon)."""
        ...

    async def stop_all(self) -> None:
        """Stop every server unit (daemon start and shut-down)."""
        ...
