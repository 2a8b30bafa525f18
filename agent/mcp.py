"""MCP tools (``mcp__<server>__<tool>``): one call through the host's ``mcp.sock``.

The servers run host-side; the host decides everything (the grant, the pinned definition, caps,
redaction). This side only sends the call and labels what comes back as the untrusted data it
is: a tool's text goes to the model as a result, never as instructions.
"""

from __future__ import annotations

import grpc

from agent.metered import call_metered
from ironclaw.mcp.v1 import mcp_pb2, mcp_pb2_grpc

TOOL_PREFIX = "mcp__"
CALL_TIMEOUT = 150.0  # the host's own time-out (120 s) answers first

_channels: dict[str, grpc.Channel] = {}


def close_channels() -> None:
    """Close the kept channels (the agent is idle: gRPC's threads end with the last channel);
    the next call opens one again."""
    while _channels:
        _channels.popitem()[1].close()


def _stub(socket_path: str) -> mcp_pb2_grpc.McpServiceStub:
    # One channel kept while the agent is busy (set-up costs ~20 ms across gVisor); closed when
    # it goes idle (close_channels).
    channel = _channels.get(socket_path)
    if channel is None:
        channel = _channels[socket_path] = grpc.insecure_channel(f"unix:{socket_path}")
    return mcp_pb2_grpc.McpServiceStub(channel)


def label(name: str) -> str:
    """``server/tool`` for ``mcp__server__tool`` (the name as given if it is not one)."""
    server, sep, tool = name[len(TOOL_PREFIX) :].partition("__")
    return f"{server}/{tool}" if name.startswith(TOOL_PREFIX) and sep else name


def call(name: str, arguments_json: str, socket_path: str) -> str:
    """Run one call; the answer (or the host's refusal) as text for the model."""
    request = mcp_pb2.CallToolRequest(name=name, arguments_json=arguments_json)
    try:
        stub = _stub(socket_path)
        response = call_metered(lambda: stub.CallTool(request, timeout=CALL_TIMEOUT))
    except grpc.RpcError as err:
        return f"error: MCP tool {label(name)} refused ({err.code().name.lower()}): {err.details()}"
    return render(name, response)


def render(name: str, response: mcp_pb2.CallToolResponse) -> str:
    kind = "error" if response.is_error else "result"
    text = f"[untrusted {kind} of MCP tool {label(name)}]\n{response.text}"
    if response.truncated:
        text += "\n[cut by the host at its size cap]"
    return text
