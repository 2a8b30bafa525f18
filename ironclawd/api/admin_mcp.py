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
from ironclawd.domain.agents import find_agent
from ironclawd.domain.mcp import McpServer, McpToolDef
from ironclawd.errors import InvalidArgument
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

        find_agent(self._registry, request.agent)
        try:
            raw = json.loads(request.server_json)
        except ValueError:
            raise InvalidArgument("server_json: not valid JSON") from None
        # Whatever tools the request lists are replaced by what the server itself says.
        server = dataclasses.replace(parse_server(raw), tools=())
        who = operator()
        # The probe runs the command now, before any approval: it is audited like a change.
        self._audit_trail.record("mcp.probe", who, agent=request.agent, server=server.name,
                                 command=list(server.command))  # fmt: skip
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
