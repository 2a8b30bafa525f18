"""How a call on a session's socket is let in (api/sandbox.py serves the services).

The interceptor says which session and socket a call came in on (from the abstract address the
splice connected from, api/sandbox_sockets.py), serves each service only on its own socket,
refuses methods no sandbox socket has (audited at a bounded rate), meters each session's calls
and bounds how long one may run. Metering has two parts: a call rate (``[sockets]
calls_per_second``), and a share of the event loop's time (``loop_share``). Calls
are not alike: one request may carry 4 MiB to parse and check, and a box looping on such calls
held the daemon's one loop for most of every second. So grpc hands the handlers a request's
bytes, which are parsed and checked only once the call is let in, and each step the call takes
on the loop (parse, check, the servicer's own work between its awaits) is charged to its
session in CPU time of the loop's thread. While a session's share is overdrawn its calls are
refused with the retry-after trailer, which the agent waits out (agent/metered.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from ironclawd import ratelog
from ironclawd.api.boundary import admit_request, lenient, refuse
from ironclawd.api.limits import Charged, Share, TokenBucket
from ironclawd.api.sandbox_sockets import PREFIX, SandboxPeer
from ironclawd.api.status import ANSWERED, RETRY_AFTER_KEY, millis
from ironclawd.config import SocketsConfig
from ironclawd.ports import AuditSink, Clock
from ironclawd.services.audit import Throttled

log = logging.getLogger("ironclawd.sandbox-api")

# Which socket each service may be reached through.
SERVICE_SOCKET = {
    "ironclaw.model.v1.ModelService": "model",
    "ironclaw.egress.v1.EgressService": "egress",
    "ironclaw.gateway.v1.GatewayService": "gateway",
    "ironclaw.mcp.v1.McpService": "mcp",
}
# The session and socket of the call being served (set when it is let in).
CURRENT_PEER: contextvars.ContextVar[SandboxPeer] = contextvars.ContextVar("ironclaw_sandbox_peer")
T = TypeVar("T")

Context = grpc.aio.ServicerContext[Any, Any]

if TYPE_CHECKING:
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.aio.ServerInterceptor


class RefusalAudit:
    """Audit a sandbox's refused calls (a method that does not exist, such as an approve, or a
    service asked for on the wrong socket), throttled per session (services/audit.Throttled)."""

    def __init__(self, audit: AuditSink, clock: Clock, per_minute: int = 20) -> None:
        self._throttled = Throttled(audit, clock, per_minute)

    def __call__(self, peer: SandboxPeer | None, method: str, why: str) -> None:
        sid = peer.sid if peer is not None else "?"
        socket = peer.socket if peer is not None else "?"
        ratelog.warning(log, sid, f"{socket}.sock refused call",
                        "session %s: %s.sock call %.200r refused: %s", sid, socket, method,
                        why)  # fmt: skip
        self._throttled.record(sid, "sandbox.refused", f"session:{sid}", reason=why,
                               socket=socket, method=method[:200])  # fmt: skip


class PeerInterceptor(_Interceptor):
    """Says which session and socket a call came in on, serves each service only on its own
    socket, meters calls per session (their number and their time on the event loop) and
    bounds how long one may run. A request is parsed only once its call is let in."""

    def __init__(
        self,
        peers: dict[str, SandboxPeer],
        refused: RefusalAudit,
        limits: SocketsConfig,
        *,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self._peers = peers
        self._refused = refused
        self._limits = limits
        self._cpu = cpu
        # Per session; SandboxApi.open/close keep them (``meter``/``forget``).
        self.rates: dict[str, TokenBucket] = {}
        self.shares: dict[str, Share] = {}

    def meter(self, sid: str) -> None:
        rate = self._limits.calls_per_second
        self.rates[sid] = TokenBucket(rate, 2 * rate)
        self.shares[sid] = Share(self._limits.loop_share, self._limits.loop_share_burst_seconds)

    def forget(self, sid: str) -> None:
        self.rates.pop(sid, None)
        self.shares.pop(sid, None)

    def _peer(self, context: grpc.aio.ServicerContext[Any, Any]) -> SandboxPeer | None:
        return self._peers.get(context.peer().removeprefix(f"unix-abstract:{PREFIX}"))

    async def _meter(self, peer: SandboxPeer | None, context: Context) -> None:
        """Refuse a call over the session's rate, or while its calls' time on the event loop is
        overdrawn. Every call comes here first: from here on, its status carries the host's
        trailer (an abort that sets none keeps it)."""
        context.set_trailing_metadata(ANSWERED)
        if peer is None:
            return
        wait = 0.0
        rate = self.rates.get(peer.sid)
        if rate is not None and not rate.take():
            ratelog.warning(log, peer.sid, "calls over rate",
                            "session %s: call on %s.sock refused: over %g calls a second",
                            peer.sid, peer.socket, self._limits.calls_per_second)  # fmt: skip
            wait = rate.wait_seconds()
        share = self.shares.get(peer.sid)
        if not wait and share is not None and share.overdrawn():
            ratelog.warning(log, peer.sid, "calls over loop share",
                            "session %s: call on %s.sock refused: its calls took over %g s of "
                            "the event loop a second", peer.sid, peer.socket,
                            self._limits.loop_share)  # fmt: skip
            wait = share.wait_seconds()
        if wait:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many calls: slow down",
                                trailing_metadata=((RETRY_AFTER_KEY, millis(wait)),))  # fmt: skip

    def _charged(self, peer: SandboxPeer, awaitable: Awaitable[T]) -> Charged[T]:
        """``awaitable``, its steps on the event loop charged to ``peer``'s session."""
        share = self.shares.get(peer.sid)
        return Charged(awaitable, share.spend if share is not None else _free, self._cpu)

    def _no_such_method(self, method: str) -> grpc.RpcMethodHandler[Any, Any]:
        async def refuse(request: bytes, context: Context) -> None:
            peer = self._peer(context)
            await self._meter(peer, context)
            self._refused(peer, method, "no such method")
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
        # grpc hands the handlers the request's bytes: they are parsed (and checked) only once
        # the call is let in, and the parse is charged to its session like the rest of its work.
        call = _Call(details.method, SERVICE_SOCKET.get(service),
                     lenient(handler.request_deserializer) or _raw)  # fmt: skip
        if handler.unary_unary is not None:
            unary = self._unary(call, handler.unary_unary)
            return grpc.unary_unary_rpc_method_handler(unary, None, handler.response_serializer)
        if handler.unary_stream is not None:
            stream = self._stream(call, handler.unary_stream)  # type: ignore[arg-type]
            return grpc.unary_stream_rpc_method_handler(stream, None, handler.response_serializer)
        raise RuntimeError(f"{details.method}: only unary and server-streaming calls are served")

    async def _admit(self, call: _Call, context: Context) -> SandboxPeer:
        peer = self._peer(context)
        await self._meter(peer, context)
        if peer is None or peer.socket != call.socket:
            self._refused(peer, call.method, "not served on this socket")
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "not served on this socket")
        assert peer is not None
        CURRENT_PEER.set(peer)
        if peer.conn is not None:
            peer.conn.call_started()
        return peer

    def _unary(
        self, call: _Call, inner: Callable[..., Awaitable[Any]]
    ) -> Callable[[bytes, Context], Awaitable[Any]]:
        limit = self._limits.max_call_seconds

        async def serve(raw: bytes, context: Context) -> Any:
            try:
                request = await call.admitted(raw, context)
                async with asyncio.timeout(limit):
                    return await inner(request, context)
            except TimeoutError:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "call ran too long")
            except Exception as exc:
                await refuse(exc, call.method, context)

        async def unary(raw: bytes, context: Context) -> Any:
            peer = await self._admit(call, context)
            try:
                return await self._charged(peer, serve(raw, context))
            finally:
                _done(peer)

        return unary

    def _stream(
        self, call: _Call, inner: Callable[..., AsyncIterator[Any]]
    ) -> Callable[[bytes, Context], AsyncIterator[Any]]:
        limit = self._limits.max_call_seconds

        async def stream(raw: bytes, context: Context) -> AsyncIterator[Any]:
            peer = await self._admit(call, context)
            # A client that stops reading parks this task in grpc's write, outside any timeout
            # scope of ours: the task itself is cancelled when the time is up.
            task = asyncio.current_task()
            assert task is not None
            timer = asyncio.get_running_loop().call_later(limit, task.cancel)
            try:
                request = await self._charged(peer, call.admitted(raw, context))
                items = inner(request, context)
                while True:
                    try:
                        item = await self._charged(peer, anext(items))
                    except StopAsyncIteration:
                        break
                    yield item
            except Exception as exc:
                await refuse(exc, call.method, context)
            finally:
                timer.cancel()
                _done(peer)

        return stream


@dataclass(frozen=True)
class _Call:
    """A method as the interceptor serves it: its name, the socket it is served on (None: no
    sandbox socket serves it) and how its request's bytes are parsed."""

    method: str
    socket: str | None
    parse: Callable[[bytes], Any]

    async def admitted(self, raw: bytes, context: Context) -> Any:
        """The request parsed, or the call aborted (INVALID_ARGUMENT) if it is out of shape."""
        request = self.parse(raw)
        await admit_request(request, context)
        return request


def _done(peer: SandboxPeer) -> None:
    if peer.conn is not None:
        peer.conn.call_ended()


def _raw(data: bytes) -> bytes:
    return data


def _free(seconds: float) -> None:
    """What a call of a session no longer metered is charged to."""
