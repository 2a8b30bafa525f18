"""Server interceptor: every admin call gets its kernel-derived caller, a deadline cap, and a
journal record naming the caller's uid."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from ironclawd import ratelog
from ironclawd.api.boundary import admit_request, lenient, refuse
from ironclawd.api.peer import Caller, PeerRegistry, Shares
from ironclawd.domain.message_ids import MessageId, message_id

log = logging.getLogger("ironclawd.admin")

_CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("ironclaw_caller")


def current_caller() -> Caller:
    """The caller of the RPC being served (set by :class:`CallerInterceptor`)."""
    return _CALLER.get()


if TYPE_CHECKING:
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:  # grpc's runtime class is not subscriptable; only grpc-stubs makes it generic
    _Interceptor = grpc.aio.ServerInterceptor


class CallerInterceptor(_Interceptor):
    """Resolves the caller from the connection, refuses non-members, caps the run time."""

    def __init__(
        self, registry: PeerRegistry, group: str, max_seconds: float, max_calls: int
    ) -> None:
        self._registry = registry
        self._group = group
        self._max_seconds = max_seconds
        # Calls in flight per caller, within the server's own limit (``max_calls``), which
        # refuses a call before any interceptor sees it: one user's streams must leave room.
        self.calls = Shares(max_calls)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, handler.unary_unary),
                request_deserializer=lenient(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(method, handler.unary_stream),
                request_deserializer=lenient(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            # Reflection is the only bidirectional service here.
            return grpc.stream_stream_rpc_method_handler(
                self._wrap_stream(method, handler.stream_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        raise RuntimeError(f"{method}: client-streaming handlers are not used by ironclawd")

    async def _admit(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> Caller:
        caller = self._registry.resolve(context.peer())
        if caller is None:
            log.error("admin call %s refused: connection has no kernel identity", method)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "caller identity unknown")
            raise AssertionError("unreachable")
        fields = {
            "IRONCLAW_METHOD": method,
            "IRONCLAW_CALLER_UID": caller.uid,
            "IRONCLAW_CALLER_PID": caller.pid,
        }
        if not caller.authorized:
            # At a bounded rate per uid, as every other refusal: a non-member's one connection
            # made one line per call, without end (found by a review).
            ratelog.AGENT_LOG.log(
                log,
                logging.WARNING,
                f"uid{caller.uid}",
                "admin refused",
                "admin call %s refused: %s is not in group %s",
                method,
                caller.describe(),
                self._group,
                extra=message_id(MessageId.ADMIN_CALL_REFUSED, **fields),
            )
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{caller.describe()} is not a member of group '{self._group}'",
            )
        why = self.calls.take(caller)
        if why is not None:
            ratelog.warning(log, f"uid{caller.uid}", "admin calls",
                            "admin call %s by %s refused: calls in flight: %s", method,
                            caller.describe(), why)  # fmt: skip
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"too many admin calls in flight ({why}); retry when some have ended",
            )
        log.info("admin call %s by %s", method, caller.describe(), extra=fields)
        _CALLER.set(caller)
        return caller

    def _wrap_unary(
        self, method: str, behavior: Callable[..., Any]
    ) -> Callable[..., Awaitable[Any]]:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            caller = await self._admit(method, context)
            started = time.monotonic()
            try:
                await admit_request(request, context)
                async with asyncio.timeout(self._max_seconds):
                    return await behavior(request, context)
            except TimeoutError:
                await context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"{method} ran past the daemon's limit of {self._max_seconds:g}s",
                )
            except Exception as exc:
                await refuse(exc, method, context)
            finally:
                self.calls.give(caller)
                log.debug("%s took %.1f ms", method, (time.monotonic() - started) * 1e3)

        return wrapped

    def _wrap_stream(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        limit = self._max_seconds

        async def too_long(context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{method} ran past the daemon's limit of {limit:g}s",
            )

        if inspect.isasyncgenfunction(behavior):

            async def wrapped_gen(
                request: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                caller = await self._admit(method, context)
                try:
                    await admit_request(request, context)
                    async with asyncio.timeout(limit):
                        async for item in behavior(request, context):
                            yield item
                except TimeoutError:
                    await too_long(context)
                except Exception as exc:
                    await refuse(exc, method, context)
                finally:
                    self.calls.give(caller)

            return wrapped_gen

        # Handlers that stream with ``await context.write(...)`` (grpc_health's Watch).
        async def wrapped_writer(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            caller = await self._admit(method, context)
            try:
                await admit_request(request, context)
                async with asyncio.timeout(limit):
                    await behavior(request, context)
            except TimeoutError:
                await too_long(context)
            except Exception as exc:
                await refuse(exc, method, context)
            finally:
                self.calls.give(caller)

        return wrapped_writer
