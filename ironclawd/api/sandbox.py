"""The sandbox-facing gRPC services: model proxy and approval gateway (submit/status only).

Each session gets its own sockets in its socket directory (``model.sock``, ...). The daemon
accepts on them itself, admits only processes of that session's unit (its cgroup), and splices
each connection to one internal gRPC server from an abstract address naming a random nonce; the
interceptor maps the nonce back to (session, socket). So which session is calling — and so whose
budget, persona and key apply — comes from the socket, never from anything the agent sends, and
a service is reachable only through the socket meant for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from ironclaw.egress.v1 import egress_pb2_grpc
from ironclaw.gateway.v1 import gateway_pb2_grpc
from ironclaw.model.v1 import model_pb2, model_pb2_grpc
from ironclawd.api import control
from ironclawd.api.egress import EgressServicer
from ironclawd.api.sandbox_gateway import GatewayServicer
from ironclawd.api.sockets import bind_unix_socket, remove_stale_socket
from ironclawd.api.splice import splice_to
from ironclawd.api.status import code_for
from ironclawd.domain.model import Message, ToolCall, ToolDef
from ironclawd.domain.session import unit_name
from ironclawd.errors import IronclawError
from ironclawd.ports import AuditSink
from ironclawd.services.audit import Throttled
from ironclawd.services.egress import EgressBroker
from ironclawd.services.gateway import Gateway
from ironclawd.services.model_proxy import ModelProxy
from ironclawd.services.sessions import SessionService

log = logging.getLogger("ironclawd.sandbox-api")

_PREFIX = "ironclaw-sbx/"
# Which socket each service may be reached through.
SERVICE_SOCKET = {
    "ironclaw.model.v1.ModelService": "model",
    "ironclaw.egress.v1.EgressService": "egress",
    "ironclaw.gateway.v1.GatewayService": "gateway",
}
SOCKETS = ("model", "gateway", "egress")  # egress.sock: only if granted (EgressBroker.has_grants)
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_CONNECTIONS_PER_SOCKET = 8


@dataclass(frozen=True)
class SandboxPeer:
    sid: str
    socket: str


_PEER: contextvars.ContextVar[SandboxPeer] = contextvars.ContextVar("ironclaw_sandbox_peer")

if TYPE_CHECKING:
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.aio.ServerInterceptor


class _RefusalAudit:
    """Audit a sandbox's refused calls (a method that does not exist, such as an approve, or a
    service asked for on the wrong socket), throttled per session (services/audit.Throttled)."""

    def __init__(self, audit: AuditSink | None, per_minute: int = 20) -> None:
        self._throttled = Throttled(audit, per_minute)

    def __call__(self, peer: SandboxPeer | None, method: str, why: str) -> None:
        log.warning("sandbox call %.200r refused (%s): %s", method, peer, why)
        sid = peer.sid if peer is not None else "?"
        socket = peer.socket if peer is not None else "?"
        self._throttled.record(sid, "sandbox.refused", f"session:{sid}", reason=why,
                               socket=socket, method=method[:200])  # fmt: skip


class _PeerInterceptor(_Interceptor):
    def __init__(self, peers: dict[str, SandboxPeer], refused: _RefusalAudit) -> None:
        self._peers = peers
        self._refused = refused

    def _peer(self, context: grpc.aio.ServicerContext[Any, Any]) -> SandboxPeer | None:
        return self._peers.get(context.peer().removeprefix(f"unix-abstract:{_PREFIX}"))

    def _no_such_method(self, method: str) -> grpc.RpcMethodHandler[Any, Any]:
        async def refuse(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            self._refused(self._peer(context), method, "no such method")
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no such method on this socket")

        return grpc.unary_unary_rpc_method_handler(refuse)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(details)
        if handler is None:
            # Say no (UNIMPLEMENTED, as grpc would), but with an audit record: asking for a
            # method no sandbox socket has, an approve say, is an attempt worth recording.
            return self._no_such_method(details.method)
        service = details.method.strip("/").split("/")[0]
        expected = SERVICE_SOCKET.get(service)

        async def admit(context: grpc.aio.ServicerContext[Any, Any]) -> None:
            peer = self._peer(context)
            if peer is None or peer.socket != expected:
                self._refused(peer, details.method, "not served on this socket")
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, "not served on this socket")
            assert peer is not None
            _PEER.set(peer)

        if handler.unary_unary is not None:
            inner: Callable[..., Awaitable[Any]] = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                await admit(context)
                try:
                    return await inner(request, context)
                except IronclawError as exc:
                    await context.abort(code_for(exc), str(exc))

            return grpc.unary_unary_rpc_method_handler(
                unary, handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream is not None:
            inner_stream: Callable[..., AsyncIterator[Any]] = handler.unary_stream  # type: ignore[assignment]

            async def stream(
                request: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                await admit(context)
                try:
                    async for item in inner_stream(request, context):
                        yield item
                except IronclawError as exc:
                    await context.abort(code_for(exc), str(exc))

            return grpc.unary_stream_rpc_method_handler(
                stream, handler.request_deserializer, handler.response_serializer
            )
        raise RuntimeError(f"{details.method}: only unary and server-streaming calls are served")


class ModelServicer(model_pb2_grpc.ModelServiceServicer):
    def __init__(self, proxy: ModelProxy) -> None:
        self._proxy = proxy

    async def GetProfile(
        self, request: model_pb2.GetProfileRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> model_pb2.GetProfileResponse:
        profile = self._proxy.profile(_PEER.get().sid)
        return model_pb2.GetProfileResponse(
            agent=profile.agent,
            persona=profile.persona,
            tools=[_tool_to_proto(t) for t in profile.tools],
            max_tool_rounds=profile.max_tool_rounds,
        )

    async def Complete(
        self, request: model_pb2.CompleteRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[model_pb2.CompleteResponse]:
        messages = [_message_from_proto(m) for m in request.messages]
        tools = [ToolDef(t.name, t.description, t.parameters_json) for t in request.tools]
        async for chunk in self._proxy.complete(
            _PEER.get().sid, messages, tools, request.max_tokens
        ):
            if chunk.text:
                yield model_pb2.CompleteResponse(text_delta=chunk.text)
            elif chunk.tool_call is not None:
                call = chunk.tool_call
                yield model_pb2.CompleteResponse(
                    tool_call=model_pb2.ToolCall(
                        id=call.id, name=call.name, arguments_json=call.arguments_json
                    )
                )
            elif chunk.usage is not None:
                yield model_pb2.CompleteResponse(
                    usage=model_pb2.Usage(input_tokens=chunk.usage[0], output_tokens=chunk.usage[1])
                )
            elif chunk.stop_reason:
                yield model_pb2.CompleteResponse(stop_reason=chunk.stop_reason)


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
        proxy: ModelProxy,
        gateway: Gateway,
        sessions: SessionService,
        *,
        audit: AuditSink | None = None,
    ) -> None:
        self._internal = internal_socket
        self._dir = sessions_dir
        self._peers: dict[str, SandboxPeer] = {}
        self._servers: dict[tuple[str, str], asyncio.Server] = {}
        self._server = grpc.aio.server(
            interceptors=[_PeerInterceptor(self._peers, _RefusalAudit(audit))],
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_concurrent_streams", 16),
            ],
        )
        model_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(proxy), self._server)
        self._broker: EgressBroker | None = None
        gateway_pb2_grpc.add_GatewayServiceServicer_to_server(
            GatewayServicer(gateway, sessions, lambda: _PEER.get().sid), self._server
        )

    def serve_egress(self, broker: EgressBroker) -> None:
        """Serve the egress broker (before start) on egress.sock of sessions with grants."""
        self._broker = broker
        servicer = EgressServicer(broker, lambda: _PEER.get().sid, broker.timeout_seconds)
        egress_pb2_grpc.add_EgressServiceServicer_to_server(servicer, self._server)

    async def start(self) -> None:
        remove_stale_socket(self._internal)
        self._server.add_insecure_port(f"unix:{self._internal}")
        await self._server.start()

    async def stop(self) -> None:
        for key in list(self._servers):
            await self._close_one(key)
        await self._server.stop(1.0)

    async def open(self, sid: str) -> None:
        """Serve this session's sockets (in the directory its control socket already made)."""
        for name in SOCKETS:
            await self._close_one((sid, name))
            if name == "egress" and (self._broker is None or not self._broker.has_grants(sid)):
                continue
            sock = bind_unix_socket(self._dir / sid / f"{name}.sock", mode=0o666, group=None)
            slots = asyncio.Semaphore(MAX_CONNECTIONS_PER_SOCKET)

            async def handle(
                reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter,
                sid: str = sid,
                name: str = name,
                slots: asyncio.Semaphore = slots,
            ) -> None:
                await self._accept(sid, name, slots, reader, writer)

            self._servers[(sid, name)] = await asyncio.start_unix_server(handle, sock=sock)

    async def _accept(
        self,
        sid: str,
        name: str,
        slots: asyncio.Semaphore,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        if slots.locked() or not control.peer_in_unit(
            writer.get_extra_info("socket"), unit_name(sid)
        ):
            log.warning("session %s: refused a %s.sock connection (outside its unit or too many)",
                        sid, name)  # fmt: skip
            writer.close()
            return
        async with slots:
            nonce = secrets.token_hex(16)
            self._peers[nonce] = SandboxPeer(sid, name)
            try:
                await splice_to(self._internal, _PREFIX + nonce, reader, writer)
            finally:
                self._peers.pop(nonce, None)

    async def close(self, sid: str) -> None:
        for name in SOCKETS:
            await self._close_one((sid, name))

    async def _close_one(self, key: tuple[str, str]) -> None:
        server = self._servers.pop(key, None)
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1)
        with contextlib.suppress(FileNotFoundError):
            (self._dir / key[0] / f"{key[1]}.sock").unlink()
