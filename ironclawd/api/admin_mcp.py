"""Admin RPCs for MCP servers: probe a server before registering it, and show an agent's
servers and grants (docs/mcp.md "Registration")."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Protocol

import grpc

from ironclaw.admin.v1 import admin_pb2
from ironclawd.api.admin_changes import operator
from ironclawd.api.auth import current_caller
from ironclawd.domain.agents import find_agent
from ironclawd.domain.mcp import McpServer, McpToolDef
from ironclawd.errors import InvalidArgument, PolicyDenied
from ironclawd.services.audit import Audit
from ironclawd.services.registry import Registry

Context = grpc.aio.ServicerContext[Any, Any]
log = logging.getLogger("ironclawd.mcp")


class McpProber(Protocol):
    async def probe(self, agent: str, server: McpServer) -> tuple[McpToolDef, ...]: ...


class McpMixin:
    _registry: Registry
    _audit_trail: Audit
    _mcp: McpProber

    async def ProbeMcpServer(
        self, request: admin_pb2.ProbeMcpServerRequest, context: Context
    ) -> admin_pb2.ProbeMcpServerResponse:
        from ironclawd.domain.kinds.mcp import parse_server  # noqa: PLC0415

        spec = find_agent(self._registry, request.agent)
        try:
            raw = json.loads(request.server_json)
        except ValueError:
            raise InvalidArgument("server_json: not valid JSON") from None
        # Whatever tools the request lists are replaced by what the server itself says.
        server = dataclasses.replace(parse_server(raw), tools=())
        who = operator()
        _may_send_credentials(server, spec.mcp_servers, current_caller().uid)
        # The probe runs the command now, before any approval: it is audited like a change,
        # with where it goes and the names of the credentials it sends there.
        self._audit_trail.record(
            "mcp.probe", who, agent=request.agent, server=server.name,
            command=list(server.command), url=server.url,
            credentials=[name for _, name in server.credentials] if server.url else [],
        )  # fmt: skip
        tools = await self._mcp.probe(request.agent, server)
        return admin_pb2.ProbeMcpServerResponse(
            tools_json=json.dumps([dataclasses.asdict(t) for t in tools], sort_keys=True)
        )

    async def ListMcpServers(
        self, request: admin_pb2.ListMcpServersRequest, context: Context
    ) -> admin_pb2.ListMcpServersResponse:
        from ironclawd.domain.kinds.mcp import KIND  # noqa: PLC0415

        spec = find_agent(self._registry, request.agent)
        return admin_pb2.ListMcpServersResponse(
            view_json=json.dumps(KIND.view(spec), sort_keys=True)
        )


def _may_send_credentials(server: McpServer, registered: tuple[McpServer, ...], uid: int) -> None:
    """A probe of a remote server sends the credentials it names, before any approval, to the
    URL it names. Any member of the admin group may probe, and a member cannot read the host's
    credentials: an arbitrary URL would hand them any of them. So only root may probe a remote
    server with credentials that were never approved for it; a member may probe one the agent
    has registered (approved) with that URL and those credentials, or one without credentials.
    A stdio server's probe runs without its credentials and without network: no limit here."""
    if not server.url or not server.credentials or uid == 0:
        return
    for known in registered:
        if known.url == server.url and set(known.credentials) >= set(server.credentials):
            return
    names = ", ".join(sorted({name for _, name in server.credentials}))
    raise PolicyDenied(
        f"probing {server.url} would send it the host credentials {names} before any approval: "
        "only root may do that for a server the agent has not registered with that URL and "
        "those credentials (probe without credentials, or as root)"
    )
