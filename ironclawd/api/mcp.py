"""The MCP gateway's gRPC face on each granted session's ``mcp.sock`` (api/sandbox.py routes it
there and says which session is calling; services/mcp_gateway.py checks every call)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from ironclaw.mcp.v1 import mcp_pb2, mcp_pb2_grpc
from ironclawd.services.mcp_gateway import McpGateway

Context = grpc.aio.ServicerContext[Any, Any]


class McpServicer(mcp_pb2_grpc.McpServiceServicer):
    def __init__(self, gateway: McpGateway, current_sid: Callable[[], str]) -> None:
        self._gateway = gateway
        self._current_sid = current_sid

    async def ListTools(
        self, request: mcp_pb2.ListToolsRequest, context: Context
    ) -> mcp_pb2.ListToolsResponse:
        return mcp_pb2.ListToolsResponse(
            tools=[
                mcp_pb2.Tool(
                    name=t.model_name,
                    description=t.definition.description,
                    input_schema_json=t.definition.input_schema,
                )
                for t in self._gateway.tools(self._current_sid())
            ]
        )

    async def CallTool(
        self, request: mcp_pb2.CallToolRequest, context: Context
    ) -> mcp_pb2.CallToolResponse:
        result = await self._gateway.call(self._current_sid(), request.name, request.arguments_json)
        return mcp_pb2.CallToolResponse(
            text=result.text, is_error=result.is_error, truncated=result.truncated
        )
