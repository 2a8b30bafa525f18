"""GatewayService on a sandbox's gateway.sock: submit and status only — no approve exists here."""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import grpc

from ironclaw.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from ironclawd.errors import NotFound, RateLimited
from ironclawd.services.gateway import Gateway
from ironclawd.services.sessions import SessionService

if TYPE_CHECKING:
    from ironclawd.domain.changes import Change

Context = grpc.aio.ServicerContext[Any, Any]

# Threads that check the sessions' submissions, apart from the loop's default executor (which
# also serves every session's messages, egress lookups and starts): resolving packages runs apt
# for seconds, and a box looping on submissions must not hold the threads others need.
SUBMIT_THREADS = 2
# The thread that reads a change's status for GetChange (not behind a submission's apt run).
READ_THREADS = 1


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self, gateway: Gateway, sessions: SessionService, current_sid: Any) -> None:
        self._gateway = gateway
        self._sessions = sessions
        self._sid = current_sid  # callable: the session of the socket this call came in on
        self._executor = ThreadPoolExecutor(SUBMIT_THREADS, thread_name_prefix="gateway-submit")
        self._reads = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="gateway-read")
        self._submitting: set[str] = set()  # sessions with a submission being checked
        self._reading: set[str] = set()  # sessions with a change's status being read

    async def SubmitChange(
        self, request: gateway_pb2.SubmitChangeRequest, context: Context
    ) -> gateway_pb2.SubmitChangeResponse:
        from ironclawd.domain.kinds import creates_agent  # noqa: PLC0415

        sid = self._sid()
        own = self._sessions.get(sid).agent
        # Kinds other than those creating an agent target the session's own agent; the gateway
        # refuses (and audits) any other.
        only = None if creates_agent(request.kind) else own
        # One at a time per session: the hourly limit counts an attempt when its check begins,
        # and a session's concurrent calls would each hold a thread meanwhile.
        if sid in self._submitting:
            raise RateLimited(
                f"session:{sid}: one change submission at a time; wait for the one under way"
            )
        # In a thread of the gateway's own: resolving packages asks apt for seconds. The
        # session's turn ends when that work does, not when its caller gives up on it.
        checking = asyncio.get_running_loop().run_in_executor(
            self._executor,
            functools.partial(
                self._gateway.submit,
                request.kind, request.agent or own, request.payload_json, request.reason,
                f"session:{sid}", only_agent=only,
            ),
        )  # fmt: skip
        self._submitting.add(sid)
        checking.add_done_callback(lambda done: self._finished(sid, done))
        change = await asyncio.shield(checking)
        return gateway_pb2.SubmitChangeResponse(change=_status(change))

    def _finished(self, sid: str, done: asyncio.Future[Change]) -> None:
        _ended(self._submitting, sid, done)

    async def GetChange(
        self, request: gateway_pb2.GetChangeRequest, context: Context
    ) -> gateway_pb2.GetChangeResponse:
        sid = self._sid()
        # The read waits for the state DB's lock, which a batch of another session's replies
        # holds while it is written (~25 ms for 2 MiB, more with a WAL checkpoint): not on the
        # event loop, which the read held meanwhile (found by a review), and one at a time per
        # session.
        if sid in self._reading:
            raise RateLimited(f"session:{sid}: one change status at a time; wait for the one "
                              "under way")  # fmt: skip
        reading = asyncio.get_running_loop().run_in_executor(
            self._reads, self._gateway.get, request.id
        )
        self._reading.add(sid)
        reading.add_done_callback(lambda done: _ended(self._reading, sid, done))
        change = await asyncio.shield(reading)
        if change.submitter != f"session:{sid}":
            raise NotFound(f"change {request.id} not found")
        return gateway_pb2.GetChangeResponse(change=_status(change))


def _ended(busy: set[str], sid: str, done: asyncio.Future[Change]) -> None:
    """The session's turn is over when the thread's work is, not when its caller gave up."""
    busy.discard(sid)
    if not done.cancelled():
        done.exception()  # its caller may have gone: the error is not "never retrieved"


def _status(change: Change) -> gateway_pb2.ChangeStatus:
    return gateway_pb2.ChangeStatus(
        id=change.id, state=change.state.value, hash=change.hash, note=change.note
    )
