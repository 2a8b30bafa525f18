"""Admin RPCs of the approval gateway, the agent registry and the audit log."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import grpc

from ironclaw.admin.v1 import admin_pb2
from ironclawd.api.auth import current_caller
from ironclawd.domain.agents import AgentSpec, find_agent
from ironclawd.domain.channels import host_user_allowed
from ironclawd.errors import Conflict, InvalidArgument, PolicyDenied
from ironclawd.services.audit import Audit
from ironclawd.services.gateway import Gateway
from ironclawd.services.registry import Registry

if TYPE_CHECKING:
    from ironclawd.domain.changes import Change

Context = grpc.aio.ServicerContext[Any, Any]


def operator() -> str:
    """Who decides, as the kernel told us at connect time."""
    caller = current_caller()
    return f"uid:{caller.uid}({caller.user_name})"


def operator_groups() -> frozenset[str]:
    """The names of the host groups the kernel said the caller is in at connect time (primary
    and supplementary; a gid without a name has none)."""
    return current_caller().group_names


def may_talk(spec: AgentSpec | None) -> bool:
    """Whether the agent's permissions let the caller talk to it (``user:`` and ``group:``
    entries; none named: every admin member may; no such agent: nothing to refuse)."""
    caller = current_caller()
    return spec is None or host_user_allowed(
        spec.permissions, caller.user_name, sorted(operator_groups())
    )


def require_talk(spec: AgentSpec | None) -> None:
    """Refuse the caller unless :func:`may_talk`. Talking covers sending a message, reading
    the agent's replies, and seeing (``ListHeld``) or admitting a held message to it."""
    caller = current_caller()
    if spec is not None and not may_talk(spec):
        raise PolicyDenied(
            f"uid {caller.uid} ({caller.user_name}) may not talk to agent '{spec.name}': its "
            "permissions allow only the host users and groups they name "
            f"(ironctl permissions show {spec.name})"
        )


class ChangesMixin:
    _gateway: Gateway
    _registry: Registry
    _audit_trail: Audit

    async def SubmitChange(
        self, request: admin_pb2.SubmitChangeRequest, context: Context
    ) -> admin_pb2.SubmitChangeResponse:
        # In a thread: resolving packages asks apt for seconds.
        change = await asyncio.to_thread(
            self._gateway.submit,
            request.kind,
            request.agent,
            request.payload_json,
            request.reason,
            operator(),
        )
        return admin_pb2.SubmitChangeResponse(change=change_to_proto(change))

    async def ListChanges(
        self, request: admin_pb2.ListChangesRequest, context: Context
    ) -> admin_pb2.ListChangesResponse:
        limit = request.limit or CHANGES_PAGE
        if limit > CHANGES_PAGE_MAX:
            raise InvalidArgument(f"limit: expected at most {CHANGES_PAGE_MAX}, not {limit}")
        # One page, not every change there ever was: changes are never deleted, and one of
        # 1.4 MB took the answer past the admin socket's 4 MiB for good (found by a review).
        changes, after = self._gateway.list_page(
            request.state or None, request.after_id, limit, CHANGES_PAGE_BYTES
        )
        page: list[admin_pb2.Change] = []
        size = 0
        for change in changes:
            shown = change_to_proto(change)
            size += shown.ByteSize()
            if page and size > CHANGES_PAGE_BYTES:
                after = page[-1].id
                break
            page.append(shown)
        return admin_pb2.ListChangesResponse(changes=page, next_after_id=after)

    async def GetChange(
        self, request: admin_pb2.GetChangeRequest, context: Context
    ) -> admin_pb2.GetChangeResponse:
        return admin_pb2.GetChangeResponse(change=change_to_proto(self._gateway.get(request.id)))

    async def ApproveChange(
        self, request: admin_pb2.ApproveChangeRequest, context: Context
    ) -> admin_pb2.ApproveChangeResponse:
        if not request.hash:
            raise InvalidArgument("hash: an approval must name the change's hash (change show)")
        size = _whole(self._gateway.get(request.id)).ByteSize()
        if size > CHANGE_ANSWER_MAX:
            # Shown abridged (change_to_proto): nobody can have read what it would grant.
            why = (f"it takes {size} bytes, over the {CHANGE_ANSWER_MAX} an answer holds, so "
                   "it was never shown whole; reject it")  # fmt: skip
            self._audit_trail.record(
                "change.approval_refused", operator(), change=request.id, reason=why
            )
            raise Conflict(f"cannot approve {request.id}: {why}")
        change = await self._gateway.approve(
            request.id, request.hash, operator(), operator_groups()
        )
        return admin_pb2.ApproveChangeResponse(change=change_to_proto(change))

    async def RejectChange(
        self, request: admin_pb2.RejectChangeRequest, context: Context
    ) -> admin_pb2.RejectChangeResponse:
        change = await self._gateway.reject(request.id, operator(), request.note, operator_groups())
        return admin_pb2.RejectChangeResponse(change=change_to_proto(change))

    async def ListAgents(
        self, request: admin_pb2.ListAgentsRequest, context: Context
    ) -> admin_pb2.ListAgentsResponse:
        return admin_pb2.ListAgentsResponse(
            agents=[agent_to_proto(self._registry[n]) for n in self._registry]
        )

    async def GetAgent(
        self, request: admin_pb2.GetAgentRequest, context: Context
    ) -> admin_pb2.GetAgentResponse:
        return admin_pb2.GetAgentResponse(
            agent=agent_to_proto(find_agent(self._registry, request.name))
        )

    async def ListAudit(
        self, request: admin_pb2.ListAuditRequest, context: Context
    ) -> admin_pb2.ListAuditResponse:
        limit = min(request.limit or 100, 10_000)
        records = self._audit_trail.read(request.after_seq, limit)
        return admin_pb2.ListAuditResponse(records=[json.dumps(r, sort_keys=True) for r in records])

    async def VerifyAudit(
        self, request: admin_pb2.VerifyAuditRequest, context: Context
    ) -> admin_pb2.VerifyAuditResponse:
        result = self._audit_trail.verify()
        return admin_pb2.VerifyAuditResponse(
            ok=result.ok,
            records=result.records,
            first_bad_seq=result.first_bad,
            problem=result.problem,
            append_only=self._audit_trail.append_only,
        )


CHANGES_PAGE = 100  # changes in a page when the caller names no limit
CHANGES_PAGE_MAX = 500
CHANGES_PAGE_BYTES = 3 * 1024 * 1024  # a page ends before it passes this (an answer: 4 MiB)
# A change larger than this as an answer is sent abridged (change_to_proto). Submission keeps
# changes to 3 MiB as shown (domain/changes.py MAX_SHOWN_BYTES); one stored before could take
# many megabytes, and every answer carrying it failed.
CHANGE_ANSWER_MAX = 3 * 1024 * 1024 + 512 * 1024


def change_to_proto(c: Change) -> admin_pb2.Change:
    """The change as the admin API shows it; one larger than CHANGE_ANSWER_MAX without its
    payload, before and after, and with a diff of one line saying why (it cannot be approved:
    ApproveChange), so that it can still be listed, shown and rejected."""
    whole = _whole(c)
    size = whole.ByteSize()
    if size <= CHANGE_ANSWER_MAX:
        return whole
    whole.payload_json = whole.before_json = whole.after_json = ""
    del whole.diff[:]
    whole.diff.append(
        f"(not shown: change {c.id} takes {size} bytes, over the {CHANGE_ANSWER_MAX} an "
        "answer holds; stored before changes were bounded, it can be rejected, not approved)"
    )
    return whole


def _whole(c: Change) -> admin_pb2.Change:
    from ironclawd.domain.changes import diff_lines  # noqa: PLC0415

    return admin_pb2.Change(
        id=c.id, kind=c.kind, agent=c.agent, payload_json=c.payload, reason=c.reason,
        submitter=c.submitter, before_json=c.before, after_json=c.after, hash=c.hash,
        created_at=c.created_at, expires_at=c.expires_at, state=c.state.value,
        decided_by=c.decided_by, decided_at=c.decided_at, note=c.note,
        diff=diff_lines(c.before, c.after),
    )  # fmt: skip


def agent_to_proto(a: AgentSpec) -> admin_pb2.Agent:
    from ironclawd.domain.changes import agent_view, canonical  # noqa: PLC0415

    return admin_pb2.Agent(
        name=a.name, persona=a.persona, provider=a.provider, model=a.model,
        base_url=a.base_url, credential=a.credential, tools=list(a.tools),
        memory_bytes=a.memory_bytes, tasks_max=a.tasks_max, cpu_percent=a.cpu_percent,
        view_json=canonical(agent_view(a)),
    )  # fmt: skip
