"""``ironclaw.admin.v1.AdminService``: the operator's API."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Collection
from typing import Any

import grpc

from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from ironclawd import __version__
from ironclawd.api.admin_changes import ChangesMixin, operator, require_talk
from ironclawd.api.admin_channels import ChannelsMixin
from ironclawd.api.admin_mcp import McpMixin, McpProber
from ironclawd.api.auth import current_caller
from ironclawd.domain.checks import CheckResult, Status
from ironclawd.domain.session import Session, State
from ironclawd.errors import InvalidArgument, IronclawError
from ironclawd.ports import JournalReader
from ironclawd.services.audit import Audit
from ironclawd.services.doctor import Doctor
from ironclawd.services.gateway import Gateway
from ironclawd.services.inbox import Inbox
from ironclawd.services.logs import session_logs
from ironclawd.services.messaging import MessageService, verify_record
from ironclawd.services.registry import Registry
from ironclawd.services.sessions import SessionService

Context = grpc.aio.ServicerContext[Any, Any]

_STATUS = {
    Status.PASS: admin_pb2.CHECK_STATUS_PASS,
    Status.WARN: admin_pb2.CHECK_STATUS_WARN,
    Status.FAIL: admin_pb2.CHECK_STATUS_FAIL,
    Status.SKIP: admin_pb2.CHECK_STATUS_SKIP,
}


class AdminServicer(ChangesMixin, McpMixin, ChannelsMixin, admin_pb2_grpc.AdminServiceServicer):
    def __init__(
        self,
        *,
        doctor: Doctor,
        sessions: SessionService,
        messages: MessageService,
        journal: JournalReader,
        gateway: Gateway,
        registry: Registry,
        audit: Audit,
        mcp: McpProber,
        inbox: Inbox,
        recovering: Collection[str] = frozenset(),
        config_source: str,
        started: float,
    ) -> None:
        self._doctor = doctor
        self._sessions = sessions
        self._messages = messages
        self._journal = journal
        self._gateway = gateway
        self._registry = registry
        self._audit_trail = audit
        self._mcp = mcp
        self._inbox = inbox
        self._config_source = config_source
        self._started = started
        # Sessions a restarted daemon has not settled yet (services/reconcile.py ``Recovery``),
        # and the daemon's own state: "recovering" until they all are, then "running".
        self._recovering = recovering
        self.state = "running"

    async def GetStatus(
        self,
        request: admin_pb2.GetStatusRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> admin_pb2.GetStatusResponse:
        caller = current_caller()
        return admin_pb2.GetStatusResponse(
            version=__version__,
            uptime_seconds=time.monotonic() - self._started,
            caller=admin_pb2.Caller(
                uid=caller.uid, gid=caller.gid, pid=caller.pid, user_name=caller.user_name
            ),
            config_path=self._config_source,
            pid=os.getpid(),
            state=self.state,
            pool=[
                admin_pb2.PoolRow(agent=agent, ready=ready)
                for agent, ready in (self._sessions.pool.status() if self._sessions.pool else ())
            ],
        )

    async def Doctor(
        self,
        request: admin_pb2.DoctorRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> admin_pb2.DoctorResponse:
        results = [*await self._doctor.run(), *self._inbox.checks()]
        return admin_pb2.DoctorResponse(checks=[_to_proto(r) for r in results])

    async def CreateSession(
        self, request: admin_pb2.CreateSessionRequest, context: Context
    ) -> admin_pb2.CreateSessionResponse:
        if not request.agent:
            raise InvalidArgument("agent: expected an agent name (see: ironctl agent list)")
        session = await self._sessions.create(request.agent, request.sid or None)
        return admin_pb2.CreateSessionResponse(session=self._shown(session))

    async def ListSessions(
        self, request: admin_pb2.ListSessionsRequest, context: Context
    ) -> admin_pb2.ListSessionsResponse:
        return admin_pb2.ListSessionsResponse(
            sessions=[self._shown(s) for s in self._sessions.list_sessions()]
        )

    async def GetSession(
        self, request: admin_pb2.GetSessionRequest, context: Context
    ) -> admin_pb2.GetSessionResponse:
        session = self._sessions.get(request.sid)
        return admin_pb2.GetSessionResponse(session=self._shown(session))

    async def StartSession(
        self, request: admin_pb2.StartSessionRequest, context: Context
    ) -> admin_pb2.StartSessionResponse:
        session = await self._sessions.start(request.sid)
        return admin_pb2.StartSessionResponse(session=self._shown(session))

    async def StopSession(
        self, request: admin_pb2.StopSessionRequest, context: Context
    ) -> admin_pb2.StopSessionResponse:
        session = await self._sessions.stop(request.sid)
        return admin_pb2.StopSessionResponse(session=self._shown(session))

    def _shown(self, session: Session) -> admin_pb2.Session:
        return session_to_proto(
            session, session.sid in self._recovering, self._messages.held(session.sid)
        )

    async def RemoveSession(
        self, request: admin_pb2.RemoveSessionRequest, context: Context
    ) -> admin_pb2.RemoveSessionResponse:
        await self._sessions.remove(
            request.sid, force=request.force, only_if_unused=request.only_if_unused
        )
        return admin_pb2.RemoveSessionResponse()

    async def SessionLogs(
        self, request: admin_pb2.SessionLogsRequest, context: Context
    ) -> AsyncIterator[admin_pb2.SessionLogsResponse]:
        session = self._sessions.get(request.sid)
        async for line in session_logs(self._journal, session.unit, request.lines, request.follow):
            yield admin_pb2.SessionLogsResponse(
                timestamp=line.timestamp, message=line.message, source=line.source
            )

    async def SendMessage(
        self, request: admin_pb2.SendMessageRequest, context: Context
    ) -> admin_pb2.SendMessageResponse:
        try:
            session: Session | None = self._sessions.get(request.sid)
        except IronclawError:
            session = None  # send() names what is wrong, in its own order of checks
        require_talk(self._registry.get(session.agent) if session is not None else None)
        sent = await self._messages.send(
            request.sid, request.text, request.client_id, sender=operator()
        )
        return admin_pb2.SendMessageResponse(
            seq=sent.seq, duplicate=not sent.new, replies_before=sent.replies_before
        )

    async def WatchReplies(
        self, request: admin_pb2.WatchRepliesRequest, context: Context
    ) -> AsyncIterator[admin_pb2.WatchRepliesResponse]:
        # Replies are the other half of the conversation: whoever may not send to the agent
        # may not read what it answers either (found by a review, stop 48; closed stop 50).
        try:
            session: Session | None = self._sessions.get(request.sid)
        except IronclawError:
            session = None  # watch() names what is wrong
        require_talk(self._registry.get(session.agent) if session is not None else None)
        async for reply in self._messages.watch(request.sid, request.after_seq, request.follow):
            if session is not None:  # a follow stream outlives a change to the permissions
                require_talk(self._registry.get(session.agent))
            yield admin_pb2.WatchRepliesResponse(
                reply=admin_pb2.Reply(
                    seq=reply.seq,
                    in_reply_to=reply.in_reply_to,
                    created_at=reply.created_at,
                    text=reply.body,
                    chain=reply.chain.hex(),
                )
            )

    async def VerifySession(
        self, request: admin_pb2.VerifySessionRequest, context: Context
    ) -> admin_pb2.VerifySessionResponse:
        self._sessions.get(request.sid)  # NotFound for an unknown session
        record = await asyncio.to_thread(verify_record, self._messages.store, request.sid)
        report = record if not record.ok else await self._messages.verify(request.sid)
        return admin_pb2.VerifySessionResponse(
            checked=report.checked,
            ok=report.ok,
            first_bad_seq=report.first_bad_seq,
            problem=report.problem,
            pruned=report.pruned,
        )


def session_to_proto(
    session: Session, recovering: bool = False, held: str = ""
) -> admin_pb2.Session:
    """``recovering``: a restarted daemon has not settled the session yet (shown as such, not as
    the state its record still holds). ``held``: why its replies are held in its outbound queue
    (services/ingest_holds.py), shown in its error: the one field an operator's listing has for
    what is wrong with a session."""
    return admin_pb2.Session(
        sid=session.sid,
        agent=session.agent,
        state=admin_pb2.SESSION_STATE_RECOVERING if recovering else _SESSION_STATE[session.state],
        error="; ".join(text for text in (session.error, held) if text),
        created_at=session.created_at,
        updated_at=session.updated_at,
        last_active_at=session.last_active_at,
        unit=session.unit,
        netns=session.netns,
        platform=session.platform,
        restarting=session.restarting,
    )


_SESSION_STATE = {
    State.CREATING: admin_pb2.SESSION_STATE_CREATING,
    State.STARTING: admin_pb2.SESSION_STATE_STARTING,
    State.RUNNING: admin_pb2.SESSION_STATE_RUNNING,
    State.STOPPING: admin_pb2.SESSION_STATE_STOPPING,
    State.STOPPED: admin_pb2.SESSION_STATE_STOPPED,
    State.FAILED: admin_pb2.SESSION_STATE_FAILED,
}


def _to_proto(result: CheckResult) -> admin_pb2.Check:
    return admin_pb2.Check(
        name=result.name,
        status=_STATUS[result.status],
        detail=result.detail,
        fix_hint=result.fix_hint,
        required=result.required,
        duration_seconds=result.duration_seconds,
    )
