"""GatewayService on a sandbox's gateway.sock: submit and status only — no approve exists here."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import grpc

from ironclaw.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from ironclawd.errors import NotFound
from ironclawd.services.gateway import Gateway
from ironclawd.services.sessions import SessionService

if TYPE_CHECKING:
    from ironclawd.domain.changes import Change

Context = grpc.aio.ServicerContext[Any, Any]


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self, gateway: Gateway, sessions: SessionService, current_sid: Any) -> None:
        self._gateway = gateway
        self._sessions = sessions
        self._sid = current_sid  # callable: the session of the socket this call came in on

    async def SubmitChange(
        self, request: gateway_pb2.SubmitChangeRequest, context: Context
    ) -> gateway_pb2.SubmitChangeResponse:
        from ironclawd.domain.kinds import creates_agent  # noqa: PLC0415

        sid = self._sid()
        own = self._sessions.get(sid).agent
        # Kinds other than those creating an agent target the session's own agent; the gateway
        # refuses (and audits) any other.
        only = None if creates_agent(request.kind) else own
        # In a thread: resolving packages asks apt for seconds.
        change = await asyncio.to_thread(
            self._gateway.submit,
            request.kind, request.agent or own, request.payload_json, request.reason,
            f"session:{sid}", only_agent=only,
        )  # fmt: skip
        return gateway_pb2.SubmitChangeResponse(change=_status(change))

    async def GetChange(
        self, request: gateway_pb2.GetChangeRequest, context: Context
    ) -> gateway_pb2.GetChangeResponse:
        change = self._gateway.get(request.id)
        if change.submitter != f"session:{self._sid()}":
            raise NotFound(f"change {request.id} not found")
        return gateway_pb2.GetChangeResponse(change=_status(change))


def _status(change: Change) -> gateway_pb2.ChangeStatus:
    return gateway_pb2.ChangeStatus(
        id=change.id, state=change.state.value, hash=change.hash, note=change.note
    )
