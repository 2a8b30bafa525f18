"""The sandbox-facing gRPC services: model proxy, approval gateway (submit/status only), and,
when granted, the egress broker and MCP tools.

Each session gets its own sockets in its socket directory (``model.sock``, ...). The daemon
accepts on them itself, admits only processes of that session's unit (its cgroup), and splices
each connection to one internal gRPC server from an abstract address naming a random nonce; the
interceptor maps the nonce back to (session, socket). So which session is calling — and so whose
budget, persona and key apply — comes from the socket, never from anything the agent sends, and
a service is reachable only through the socket meant for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from ironclaw.egress.v1 import egress_pb2_grpc
from ironclaw.gateway.v1 import gateway_pb2_grpc
from ironclaw.mcp.v1 import mcp_pb2_grpc
from ironclaw.model.v1 import model_pb2, model_pb2_grpc
from ironclawd.api.egress import EgressServicer
from ironclawd.api.mcp import McpServicer
from ironclawd.api.sandbox_calls import CURRENT_PEER, PeerInterceptor, RefusalAudit
from ironclawd.api.sandbox_gateway import GatewayServicer
from ironclawd.api.sandbox_sockets import SandboxPeer, SessionSockets
from ironclawd.api.sockets import remove_stale_socket
from ironclawd.config import SocketsConfig
from ironclawd.domain.model import Chunk, Message, ToolCall, ToolDef
from ironclawd.errors import ProviderError
from ironclawd.ports import AuditSink, Clock
from ironclawd.services.egress import EgressBroker
from ironclawd.services.gateway import Gateway
from ironclawd.services.mcp_gateway import McpGateway
from ironclawd.services.model_proxy import ModelProxy
from ironclawd.services.session_hooks import SessionHooks
from ironclawd.services.sessions import SessionService

# The most text, in characters, one Complete event joins from the provider's chunks: an eighth
# of the largest message (a character is at most 4 bytes in UTF-8), and 16 Ki at most.
TEXT_BATCH_CHARS = 16 * 1024
# egress.sock and mcp.sock only if granted (EgressBroker.has_grants, McpGateway.has_grants).
SOCKETS = ("model", "gateway", "egress", "mcp")
__all__ = ["SandboxApi", "SandboxPeer"]


class ModelServicer(model_pb2_grpc.ModelServiceServicer):
    def __init__(self, proxy: ModelProxy, max_message_bytes: int) -> None:
        self._proxy = proxy
        self._batch = max(1, min(TEXT_BATCH_CHARS, max_message_bytes // 8))
        self._max_bytes = max_message_bytes

    async def GetProfile(
        self, request: model_pb2.GetProfileRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> model_pb2.GetProfileResponse:
        profile = self._proxy.profile(CURRENT_PEER.get().sid)
        return model_pb2.GetProfileResponse(
            agent=profile.agent,
            persona=profile.persona,
            tools=[_tool_to_proto(t) for t in profile.tools],
            max_tool_rounds=profile.max_tool_rounds,
        )

    async def Answer(
        self, request: model_pb2.CompleteRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> model_pb2.AnswerResponse:
        """One turn, whole, in one message: what the agent's own client asks for. The proxy's
        work is Complete's; the answer goes out with the call's status in one write instead of
        an event and then the end of the stream (~0.5 ms less per model call, measured)."""
        answer = await _whole(self._turn(request))
        if (size := answer.ByteSize()) > self._max_bytes:
            raise ProviderError(
                f"the model's answer ({size} bytes) is larger than one message on "
                f"model.sock may be ([sockets] max_message_bytes = {self._max_bytes})"
            )
        return answer

    async def Complete(
        self, request: model_pb2.CompleteRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[model_pb2.CompleteResponse]:
        only = request.text_and_tool_calls_only
        async for event in _events(self._turn(request), self._batch, text_and_tool_calls_only=only):
            yield event

    def _turn(self, request: model_pb2.CompleteRequest) -> AsyncIterator[Chunk]:
        """The proxy's chunks for the calling session's request (Answer's and Complete's)."""
        messages = [_message_from_proto(m) for m in request.messages]
        tools = [ToolDef(t.name, t.description, t.parameters_json) for t in request.tools]
        return self._proxy.complete(CURRENT_PEER.get().sid, messages, tools, request.max_tokens)


async def _whole(chunks: AsyncIterator[Chunk]) -> model_pb2.AnswerResponse:
    """The provider's chunks as one answer: the text joined and the tool calls in order (usage
    and stop reason are the host's to record, as with ``text_and_tool_calls_only``)."""
    text: list[str] = []
    calls: list[model_pb2.ToolCall] = []
    async for chunk in chunks:
        if chunk.text:
            text.append(chunk.text)
        elif chunk.tool_call is not None:
            calls.append(_tool_call_to_proto(chunk.tool_call))
    return model_pb2.AnswerResponse(text="".join(text), tool_calls=calls)


def _tool_call_to_proto(call: ToolCall) -> model_pb2.ToolCall:
    return model_pb2.ToolCall(id=call.id, name=call.name, arguments_json=call.arguments_json)


async def _events(
    chunks: AsyncIterator[Chunk], batch: int, *, text_and_tool_calls_only: bool = False
) -> AsyncIterator[model_pb2.CompleteResponse]:
    """The provider's chunks as the stream's events, consecutive text joined (up to ``batch``
    characters) into one ``text_delta``: each event is a write of the daemon's and a read
    through the sandbox's sentry, and the agent only ever joins the text (a provider streams it
    a few characters at a time). Text is sent before any other event and at the end. With
    ``text_and_tool_calls_only`` (the caller asked), usage and stop reasons are not sent at all:
    a plain answer is then one event."""
    text: list[str] = []
    held = 0
    async for chunk in chunks:
        if text_and_tool_calls_only and not chunk.text and chunk.tool_call is None:
            continue
        if chunk.text:
            text.append(chunk.text)
            held += len(chunk.text)
            if held >= batch:
                yield model_pb2.CompleteResponse(text_delta="".join(text))
                text, held = [], 0
            continue
        event = _event(chunk)
        if event is None:  # an empty chunk
            continue
        if text:
            yield model_pb2.CompleteResponse(text_delta="".join(text))
            text, held = [], 0
        yield event
    if text:
        yield model_pb2.CompleteResponse(text_delta="".join(text))


def _event(chunk: Chunk) -> model_pb2.CompleteResponse | None:
    if chunk.tool_call is not None:
        return model_pb2.CompleteResponse(tool_call=_tool_call_to_proto(chunk.tool_call))
    if chunk.usage is not None:
        return model_pb2.CompleteResponse(
            usage=model_pb2.Usage(input_tokens=chunk.usage[0], output_tokens=chunk.usage[1])
        )
    if chunk.stop_reason:
        return model_pb2.CompleteResponse(stop_reason=chunk.stop_reason)
    return None


_ROLES = {model_pb2.ROLE_USER: "user", model_pb2.ROLE_ASSISTANT: "assistant",
          model_pb2.ROLE_TOOL: "tool"}  # fmt: skip


def _message_from_proto(m: model_pb2.Message) -> Message:
    calls = tuple(ToolCall(c.id, c.name, c.arguments_json) for c in m.tool_calls)
    return Message(_ROLES.get(m.role, "?"), m.text, calls, m.tool_call_id)


def _tool_to_proto(t: ToolDef) -> model_pb2.ToolDefinition:
    return model_pb2.ToolDefinition(
        name=t.name, description=t.description, parameters_json=t.parameters_json
    )


class SandboxApi:
    """The internal server and the per-session sockets that lead to it."""

    def __init__(
        self,
        internal_socket: Path,
        sessions_dir: Path,
        *,
        proxy: ModelProxy,
        gateway: Gateway,
        egress: EgressBroker,
        mcp: McpGateway,
        sessions: SessionService,
        hooks: SessionHooks,
        audit: AuditSink,
        clock: Clock,
        limits: SocketsConfig = SocketsConfig(),  # noqa: B008 (frozen)
    ) -> None:
        self._internal = internal_socket
        self._limits = limits
        self._peers: dict[str, SandboxPeer] = {}
        self._sockets = SessionSockets(internal_socket, sessions_dir, limits, self._peers)
        self._interceptor = PeerInterceptor(self._peers, RefusalAudit(audit, clock), limits)
        self._server = grpc.aio.server(
            interceptors=[self._interceptor],
            options=[
                ("grpc.max_receive_message_length", limits.max_message_bytes),
                ("grpc.max_send_message_length", limits.max_message_bytes),
                ("grpc.max_concurrent_streams", limits.max_streams_per_connection),
                # A connection with no call for this long gets a GOAWAY (the client reconnects
                # when it next calls); one whose peer stops answering pings is dropped.
                ("grpc.max_connection_idle_ms", _ms(limits.idle_timeout_seconds)),
                ("grpc.keepalive_time_ms", _ms(limits.keepalive_seconds)),
                ("grpc.keepalive_timeout_ms", _ms(min(20.0, limits.keepalive_seconds))),
                ("grpc.http2.max_pings_without_data", 0),
                ("grpc.so_reuseport", 0),
            ],
        )
        model_pb2_grpc.add_ModelServiceServicer_to_server(
            ModelServicer(proxy, limits.max_message_bytes), self._server
        )
        self._broker = egress
        servicer = EgressServicer(
            egress, lambda: CURRENT_PEER.get().sid, egress.timeout_seconds, limits.max_message_bytes
        )
        egress_pb2_grpc.add_EgressServiceServicer_to_server(servicer, self._server)
        self._mcp = mcp
        mcp_pb2_grpc.add_McpServiceServicer_to_server(
            McpServicer(mcp, lambda: CURRENT_PEER.get().sid), self._server
        )
        hooks.on_sockets(self.open, self.close)
        gateway_pb2_grpc.add_GatewayServiceServicer_to_server(
            GatewayServicer(gateway, sessions, lambda: CURRENT_PEER.get().sid), self._server
        )

    async def start(self) -> None:
        remove_stale_socket(self._internal)
        self._server.add_insecure_port(f"unix:{self._internal}")
        await self._server.start()

    async def stop(self) -> None:
        await self._sockets.close_all()
        await self._server.stop(1.0)
        # No request is left to check: the broker's check threads go (a running check ends on
        # its own within ~0.5 s; found by a review: nothing closed them).
        self._broker.close()

    async def open(self, sid: str) -> None:
        """Serve this session's sockets (in the directory its control socket already made)."""
        self._interceptor.meter(sid)
        for name in SOCKETS:
            await self._sockets.close(sid, name)
            if name == "egress" and not self._broker.has_grants(sid):
                continue
            if name == "mcp" and not self._mcp.has_grants(sid):
                continue
            await self._sockets.open(sid, name)

    async def close(self, sid: str) -> None:
        for name in SOCKETS:
            await self._sockets.close(sid, name)
        self._interceptor.forget(sid)


def _ms(seconds: float) -> int:
    return int(seconds * 1000)
