"""Remote MCP servers (``url``), reached only under the egress broker's rules (docs/mcp.md
"Remote servers"): the ``McpLauncher`` for them, and the one dispatching between it and the
stdio launcher.

The SDK's own streamable HTTP client speaks MCP; what it is handed is an ``httpx2`` client whose
transport (``PinnedTransport``) is the only way out, and it:
- resolves the registered host once, host-side, when the server is opened, and refuses it if any
  answer is one the broker may not reach (domain/addresses.py: loopback, link-local, metadata,
  private unless ``[egress] internal_cidrs`` opens it), before any connection;
- connects to that checked address only (the IP literal; nothing resolves the name again), with
  TLS verified for the registered name (SNI) against the system store or ``[egress] ca_file``;
- refuses any request to another scheme, host or port than the registered one, so a redirect
  elsewhere (the SDK follows only same-origin ones) or anything else cannot leave;
- cuts a response body at ``[mcp] max_message_bytes``, and audits every request (``mcp.remote``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ironclawd.domain.addresses import IPAddress, refusal_reason
from ironclawd.domain.egress import EgressLimits
from ironclawd.domain.mcp import McpLimits, McpServer
from ironclawd.domain.mcp_url import McpEndpoint, parse_url
from ironclawd.errors import IronclawError, McpServerFailed
from ironclawd.ports import Credentials, Resolver
from ironclawd.ports.mcp import McpLauncher, McpTransport

if TYPE_CHECKING:
    from ironclawd.host.mcp_pinned import PinnedTransport

Record = Callable[..., None]  # (event, actor, **fields): the audit trail


async def resolve_checked(
    endpoint: McpEndpoint, resolver: Resolver, limits: EgressLimits
) -> IPAddress:
    """The one address to connect to; McpServerFailed naming the reason if any answer may not be
    reached (the broker's rule: one bad answer spoils the name)."""
    if endpoint.address is not None:
        answers: list[IPAddress] = [endpoint.address]
    else:
        try:
            raw = await resolver.resolve(endpoint.host, endpoint.port)
            answers = [ipaddress.ip_address(a.split("%", 1)[0]) for a in raw]
        except (IronclawError, ValueError) as exc:
            raise McpServerFailed(f"resolving {endpoint.host}: {exc}") from None
        if not answers:
            raise McpServerFailed(f"resolving {endpoint.host}: no addresses")
    for answer in answers:
        reason = refusal_reason(answer, limits.internal_cidrs)
        if reason is not None:
            raise McpServerFailed(
                f"egress: {endpoint.host} resolves to {answer}, a {reason}; refused"
            )
    return answers[0]


@dataclass
class RemoteTransport(McpTransport):
    """A remote server's SDK streams, and why its HTTP transport last gave up."""

    pinned: PinnedTransport | None = None

    def why(self) -> str:
        return self.pinned.reason if self.pinned is not None else ""

    def over_cap(self) -> str | None:
        return self.pinned.cut_id if self.pinned is not None else None


class RemoteMcpLauncher:
    """``ports.McpLauncher`` for ``url`` servers (nothing to start or stop host-side)."""

    def __init__(  # noqa: PLR0917
        self,
        credentials: Credentials,
        limits: McpLimits,
        egress: EgressLimits,
        resolver: Resolver,
        record: Record,
        context: Callable[[], ssl.SSLContext],
    ) -> None:
        self._credentials = credentials
        self._limits = limits
        self._egress = egress
        self._resolver = resolver
        self._record = record
        self._context = context  # called at each open: not at the daemon's start

    @contextlib.asynccontextmanager
    async def open(self, agent: str, server: McpServer) -> AsyncIterator[McpTransport]:
        # The SDK (~0.2-0.4 s of imports) is imported when a remote server is first opened, not
        # when the daemon starts (issue 17).
        from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415

        from ironclawd.host.mcp_pinned import PinnedTransport, pinned_client  # noqa: PLC0415

        endpoint = parse_url(server.url)
        actor = f"agent:{agent}"
        base = {"server": server.name, "host": endpoint.host, "port": endpoint.port}
        try:
            address = await resolve_checked(endpoint, self._resolver, self._egress)
        except McpServerFailed as exc:
            self._record("mcp.remote", actor, **base, refused=str(exc))
            raise
        headers = {header: self._credentials.get(name) for header, name in server.credentials}

        def audit(**fields: Any) -> None:
            self._record("mcp.remote", actor, **base, address=str(address), **fields)

        transport = PinnedTransport(
            endpoint, address, self._context(), self._limits.max_message_bytes, audit
        )
        wait = max(self._limits.call_timeout_seconds, self._limits.list_timeout_seconds)
        client = pinned_client(transport, headers, wait, self._egress.connect_timeout_seconds)
        async with (
            client,
            streamable_http_client(
                server.url, http_client=client, max_sse_event_size=self._limits.max_message_bytes
            ) as (read, write),
        ):
            yield RemoteTransport(read=read, write=write, pinned=transport)

    async def stop(self, agent: str, server: str) -> None:
        return None

    async def stop_all(self) -> None:
        return None


class McpLaunchers:
    """``ports.McpLauncher`` that sends each server to the launcher of its kind."""

    def __init__(self, stdio: McpLauncher, remote: McpLauncher) -> None:
        self._stdio = stdio
        self._remote = remote

    def open(
        self, agent: str, server: McpServer
    ) -> contextlib.AbstractAsyncContextManager[McpTransport]:
        return (self._remote if server.url else self._stdio).open(agent, server)

    async def stop(self, agent: str, server: str) -> None:
        await self._stdio.stop(agent, server)

    async def stop_all(self) -> None:
        await self._stdio.stop_all()
