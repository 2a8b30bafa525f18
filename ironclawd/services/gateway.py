"""The approval gateway: every capability change waits for a human (docs/architecture.md §7).

Deterministic verifiers run first (schema, supported kind, target exists or not, no-op, rate of
submissions per submitter) and may reject at once; everything that passes them is held pending.
Only the admin API offers approve and reject — the sandbox's gateway socket has submit and
status alone — and no setting makes any kind auto-apply (the human floor). An approval must name
the change's hash, is single-use (the state machine allows one decision), may require
approver != submitter (four-eyes, per kind), and is refused after the change's expiry. Applying
re-checks that the agent still looks like it did at submission. Every step is audited.

The change model (``ironclawd.domain.changes``: every kind, the skill and minisign formats,
cryptography's ed25519) is imported where a method needs it, not here: the daemon wires the
gateway before READY but first uses it after (``resume``), and that import was ~12 ms of every
start (docs/development.md, "The change kinds load after READY").
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from collections import deque
from collections.abc import Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.channels import ChannelConfig, approver_group
from ironclawd.domain.message_ids import MessageId, message_id
from ironclawd.errors import (
    Conflict,
    InvalidArgument,
    IronclawError,
    NotFound,
    PolicyDenied,
    RateLimited,
)
from ironclawd.ports import (
    AuditSink,
    ChangeRecords,
    Clock,
    MountSources,
    PackageImages,
    TrustedKeys,
)
from ironclawd.services.audit import Throttled
from ironclawd.services.host_checks import GatewayHostChecks
from ironclawd.services.registry import Registry

if TYPE_CHECKING:
    from ironclawd.domain.changes import Change, ParsedChange

log = logging.getLogger("ironclawd.gateway")

SESSION_SUBMITTER = "session:"
RATE_WINDOW_SECONDS = 3600.0
# Submitters whose attempts are remembered before the oldest windows are swept (a removed
# session's stay until then).
MAX_TRACKED_SUBMITTERS = 4096


@dataclass(frozen=True)
class GatewayPolicy:
    expiry_seconds: float = 7 * 24 * 3600
    four_eyes: frozenset[str] = frozenset()
    submissions_per_hour: int = 20  # per submitter
    mount_allowlist: tuple[str, ...] = ()  # host dirs under which mounts may be granted


Restarter = Callable[[str], Coroutine[Any, Any, list[str]]]


class Gateway:
    def __init__(
        self,
        *,
        store: ChangeRecords,
        registry: Registry,
        audit: AuditSink,
        policy: GatewayPolicy,
        restart_agent_sessions: Restarter,
        mounts: MountSources,
        clock: Clock,
        skill_keys: TrustedKeys | None = None,
        packages: PackageImages | None = None,
        channels: Sequence[ChannelConfig] = (),
        drivers: Callable[[str], Collection[str]] | None = None,
        resume_pending: bool = False,
    ) -> None:
        self._store = store
        # At a daemon's start (``resume_pending``) approvals wait for ``resume``: a change
        # approved before it, built on a change whose spec had reached the registry before a
        # crash, made resume find that change "changed since" and record it failed, while it
        # was in effect (found by a review).
        self._resumed = asyncio.Event()
        if not resume_pending:
            self._resumed.set()
        # Who has sent a session messages (``MessageService.senders``): under four-eyes none
        # of them may approve what that session submits.
        self._drivers = drivers
        self._mounts = mounts
        self._registry = registry
        self._audit = audit
        self._policy = policy
        self._restart = restart_agent_sessions
        self._clock = clock
        self._host = GatewayHostChecks(
            mounts=mounts, mount_allowlist=policy.mount_allowlist, keys=skill_keys,
            packages=packages, channels=channels, agents=registry,
        )  # fmt: skip
        self._lock = asyncio.Lock()
        self._work: set[asyncio.Task[Change]] = set()
        # An agent can be refused in a loop (over its rate, say): recorded, but not without end.
        self._refusals = Throttled(audit, clock)
        # Each session's submission attempts in the last hour, refused ones included
        # (``_check_rate``); submit runs in worker threads.
        self._attempts: dict[str, deque[float]] = {}
        self._attempts_lock = threading.Lock()

    # -- submit ---------------------------------------------------------------------------

    def submit(
        self,
        kind: str,
        agent: str,
        payload_json: str,
        reason: str,
        submitter: str,
        *,
        only_agent: str | None = None,
    ) -> Change:
        """Verify and hold a change. ``only_agent``: the one agent this submitter may target (a
        session's own); asking for another is refused like any other verifier's refusal."""
        from ironclawd.domain.changes import Change, canonical, change_hash  # noqa: PLC0415

        now = self._clock.time()
        try:
            parsed, before, after = self._verify(
                kind, agent, payload_json, reason, submitter, only_agent=only_agent
            )
        except (InvalidArgument, NotFound, Conflict, PolicyDenied) as exc:
            self._refusals.record(
                submitter, "change.refused", submitter, kind=kind, agent=agent,
                reason=str(exc)[:500],
            )  # fmt: skip
            raise
        payload_text = canonical(parsed.to_json())
        sid = submitter.removeprefix("session:") if submitter.startswith("session:") else ""
        drivers = tuple(sorted(self._drivers(sid))) if sid and self._drivers else ()
        change = Change(
            id=f"chg-{secrets.token_hex(6)}",
            kind=kind,
            agent=agent,
            payload=payload_text,
            reason=reason,
            submitter=submitter,
            before=before,
            after=after,
            hash=change_hash(kind, agent, payload_text, before),
            created_at=now,
            expires_at=now + self._policy.expiry_seconds,
            drivers=drivers,
        )
        self._store.insert_change(change)
        self._audit.record(
            "change.submitted", submitter, change=change.id, kind=kind, agent=agent,
            hash=change.hash, **({"session_senders": list(drivers)} if drivers else {}),
        )  # fmt: skip
        log.info(
            "change %s (%s on %s) submitted by %s: pending",
            change.id,
            kind,
            agent,
            submitter,
            extra=_change_fields(MessageId.CHANGE_PENDING, change),
        )
        return change

    def _verify(
        self,
        kind: str,
        agent: str,
        payload_json: str,
        reason: str,
        submitter: str,
        *,
        only_agent: str | None,
    ) -> tuple[ParsedChange[Any], str, str]:
        """The deterministic verifiers; any of them may reject the change outright."""
        from ironclawd.domain.changes import (  # noqa: PLC0415
            agent_view,
            canonical,
            check_size,
            parse_change,
        )

        self._check_rate(submitter, self._clock.time())
        if only_agent is not None and agent != only_agent:
            raise PolicyDenied(
                f"a session of agent '{only_agent}' may only request changes to itself"
            )
        parsed = parse_change(kind, agent, payload_json)
        parsed.host_check(self._host)
        parsed = parsed.resolved(self._host)
        parsed.authorize(submitter)
        if len(reason) > 2000:
            raise InvalidArgument("reason: expected at most 2000 characters")
        current = self._registry.get(agent)
        if not parsed.kind.creates_agent and current is None:
            raise NotFound(f"agent '{agent}' not found")
        after_spec = parsed.apply(current)
        before, after = canonical(agent_view(current)), canonical(agent_view(after_spec))
        if before == after:
            raise InvalidArgument(f"change to agent '{agent}' would change nothing")
        check_size(canonical(parsed.to_json()), before, after, reason)
        return parsed, before, after

    def _check_rate(self, submitter: str, now: float) -> None:
        """At most ``submissions_per_hour`` per submitter. A session's attempts count, refused
        ones too, and one is counted before it is checked: checking may cost real work
        (resolving packages runs apt for seconds) and a refused change is not stored, so
        counting stored changes alone let a box run the resolver without end, and let
        concurrent submissions all pass one count. An operator's stored changes count."""
        limit = self._policy.submissions_per_hour
        since = now - RATE_WINDOW_SECONDS
        with self._attempts_lock:
            attempts = (
                self._recent_attempts(submitter, since)
                if submitter.startswith(SESSION_SUBMITTER)
                else None
            )
            stored = self._store.count_changes_since(submitter, since)
            if max(stored, len(attempts) if attempts is not None else 0) >= limit:
                raise RateLimited(
                    f"{submitter}: at most {limit} change submissions per hour; wait before "
                    "submitting more"
                )
            if attempts is not None:
                attempts.append(now)

    def _recent_attempts(self, submitter: str, since: float) -> deque[float]:
        """``submitter``'s attempts since ``since`` (under ``_attempts_lock``)."""
        window = self._attempts.get(submitter)
        if window is None:
            if len(self._attempts) >= MAX_TRACKED_SUBMITTERS:
                for key in [k for k, w in self._attempts.items() if not w or w[-1] <= since]:
                    del self._attempts[key]
            window = self._attempts[submitter] = deque()
        while window and window[0] <= since:
            window.popleft()
        return window

    # -- queries --------------------------------------------------------------------------

    def get(self, change_id: str) -> Change:
        return self._expire_if_due(self._store.get_change(change_id))

    def list_changes(self, state: str | None = None) -> list[Change]:
        from ironclawd.domain.changes import ChangeState  # noqa: PLC0415

        if state is not None and state not in {s.value for s in ChangeState}:
            raise InvalidArgument(
                f"state: expected one of {', '.join(s.value for s in ChangeState)}, got {state!r}"
            )
        changes = [self._expire_if_due(c) for c in self._store.list_changes()]
        return [c for c in changes if state is None or c.state.value == state]

    def list_page(
        self, state: str | None, after: str, limit: int, max_bytes: int
    ) -> tuple[list[Change], str]:
        """A page for ListChanges: of at most ``limit`` (at least 1) changes read after change
        ``after`` ("": from the first) in ``list_changes``' order, ending before ``max_bytes``
        of payload, before and after, those of ``state`` (None: all); and the id to read after
        for the next page ("": none left)."""
        from ironclawd.domain.changes import ChangeState  # noqa: PLC0415

        if state is not None and state not in {s.value for s in ChangeState}:
            raise InvalidArgument(
                f"state: expected one of {', '.join(s.value for s in ChangeState)}, got {state!r}"
            )
        # A pending change past its expiry is expired: for those, every state is read and such
        # a change becomes expired here.
        stored = None if state == ChangeState.EXPIRED.value else state
        rows, more = self._store.list_changes_page(stored, after, limit, max_bytes)
        changes = [self._expire_if_due(c) for c in rows]
        kept = [c for c in changes if state is None or c.state.value == state]
        return kept, rows[-1].id if more else ""

    def _expire_if_due(self, change: Change) -> Change:
        from ironclawd.domain.changes import ChangeState, transition  # noqa: PLC0415

        if change.state is ChangeState.PENDING and self._clock.time() >= change.expires_at:
            change = transition(change, ChangeState.EXPIRED, decided_at=self._clock.time())
            self._store.save_change(change)
            self._audit.record("change.expired", "ironclawd", change=change.id)
        return change

    # -- decisions (admin API only) -------------------------------------------------------

    async def approve(
        self,
        change_id: str,
        expected_hash: str,
        approver: str,
        approver_groups: Collection[str] = (),
    ) -> Change:
        """``approver_groups``: the host groups the kernel says the approver is in (primary and
        supplementary), for the agent's approver-group rule (its permissions)."""
        # Once decided, the change is applied in a task of the gateway's: a client that leaves
        # (its deadline) must not cut the apply between the registry and the sessions' restart.
        task = asyncio.get_running_loop().create_task(
            self._approve(change_id, expected_hash, approver, approver_groups)
        )
        self._work.add(task)
        task.add_done_callback(self._work.discard)
        task.add_done_callback(_retrieve)
        return await asyncio.shield(task)

    async def _approve(
        self, change_id: str, expected_hash: str, approver: str, groups: Collection[str]
    ) -> Change:
        from ironclawd.domain.changes import ChangeState, transition  # noqa: PLC0415

        await self._resumed.wait()
        async with self._lock:
            change = self.get(change_id)
            if change.state is not ChangeState.PENDING:
                self._refuse(change, approver, f"it is {change.state.value}, not pending")
            # One approved before a restart and not applied yet (a resume that failed or was
            # cut short): a change approved on top would make it look "changed since" when it
            # is applied at the next start, and it would be recorded failed while in effect.
            waiting = [c.id for c in self._store.list_changes(ChangeState.APPROVED.value)
                       if c.agent == change.agent and c.id != change.id]  # fmt: skip
            if waiting:
                self._refuse(change, approver, f"change {waiting[0]} of agent '{change.agent}' "
                             "was approved before a restart and is not applied yet; it is "
                             "applied again at the next start of ironclawd")  # fmt: skip
            kinds = self._effect_kinds(change)
            self._check_approver_group(change, approver, groups, "approve", kinds)
            # Bytes: compare_digest raises TypeError on a str holding non-ASCII characters.
            given = expected_hash.encode("utf-8", "surrogateescape")
            if not given or not secrets.compare_digest(given, change.hash.encode()):
                self._refuse(change, approver, "the hash given does not match the change")
            watched = sorted(kinds & self._policy.four_eyes)
            if watched and _same_person(approver, change.submitter):
                self._refuse(change, approver, "four-eyes: the submitter cannot approve it "
                             f"(it is a {' and '.join(watched)} change)")  # fmt: skip
            if watched and any(_same_person(approver, d) for d in change.drivers):
                # A session does what its senders ask (a mock model even runs "/tool ..."): a
                # member could have her own change submitted by a session, then approve it.
                self._refuse(change, approver, f"four-eyes: {approver} sent messages to "
                             f"{change.submitter}, which submitted it (it is a "
                             f"{' and '.join(watched)} change)")  # fmt: skip
            change = transition(change, ChangeState.APPROVED, decided_by=approver,
                                decided_at=self._clock.time())  # fmt: skip
            self._store.save_change(change)
            self._audit.record("change.approved", approver, change=change.id, hash=change.hash)
            return await self._apply(change)

    async def reject(
        self, change_id: str, approver: str, note: str, approver_groups: Collection[str] = ()
    ) -> Change:
        from ironclawd.domain.changes import ChangeState, transition  # noqa: PLC0415

        async with self._lock:
            change = self.get(change_id)
            if change.state is not ChangeState.PENDING:
                self._refuse(change, approver, f"it is {change.state.value}, not pending")
            kinds = self._effect_kinds(change, groups=False)
            self._check_approver_group(change, approver, approver_groups, "reject", kinds)
            change = transition(change, ChangeState.REJECTED, decided_by=approver,
                                decided_at=self._clock.time(), note=note[:2000])  # fmt: skip
            self._store.save_change(change)
            self._audit.record("change.rejected", approver, change=change.id, note=note[:500])
            log.info("change %s (%s on %s) rejected by %s", change.id, change.kind, change.agent,
                     approver, extra=_change_fields(MessageId.CHANGE_REJECTED, change))  # fmt: skip
            return change

    def _effect_kinds(self, change: Change, *, groups: bool = True) -> frozenset[str]:
        """The kinds ``change`` amounts to on the agent as it is now: its own, and those whose
        grants it also changes (a skill bringing an egress rule is an egress change too) or
        whose approver group it changes, which the rules keyed by kind (four-eyes, approver
        groups) hold for. A change that no longer applies is its own kind only: applying it
        fails anyway."""
        from ironclawd.domain.changes import effect_kinds  # noqa: PLC0415

        after = self._after(change)
        if after is None:
            return frozenset({change.kind})
        return effect_kinds(change.kind, self._registry.get(change.agent), after, groups=groups)

    def _after(self, change: Change) -> AgentSpec | None:
        """The agent as ``change`` would leave it now; None if it no longer applies."""
        from ironclawd.domain.changes import parse_change  # noqa: PLC0415

        try:
            return parse_change(change.kind, change.agent, change.payload).apply(
                self._registry.get(change.agent)
            )
        except IronclawError:
            return None

    def _check_approver_group(
        self, change: Change, approver: str, groups: Collection[str], verb: str,
        kinds: Collection[str],
    ) -> None:  # fmt: skip
        """The agent's permissions may name a host group that alone decides a kind for it (on
        top of ironclaw-admin), for each of ``kinds`` the change amounts to: read from the agent
        as it is now, so a permissions change is decided under the rule it would replace."""
        # Root is no exception (a group decides for root too); root can always join a group,
        # so a group emptied on the host never leaves an agent nobody can change.
        spec = self._registry.get(change.agent)
        for kind in sorted(kinds):
            group = approver_group(spec.permissions, kind) if spec is not None else None
            if group is not None and group not in groups:
                why = (
                    f"agent '{change.agent}' requires {kind} changes to be decided by a member "
                    f"of host group '{group}', and {approver} is not one"
                )
                if kind != change.kind:
                    why += f" (this {change.kind} change also changes its {kind})"
                self._audit.record(
                    "change.approval_refused", approver, change=change.id, reason=why
                )
                raise PolicyDenied(f"cannot {verb} {change.id}: {why}")

    def _refuse(self, change: Change, approver: str, why: str) -> None:
        self._audit.record("change.approval_refused", approver, change=change.id, reason=why)
        raise Conflict(f"cannot approve {change.id}: {why}")

    async def _apply(self, change: Change, **fields: object) -> Change:
        from ironclawd.domain.changes import ChangeState, transition  # noqa: PLC0415

        try:
            # In a thread: preparing may build an image (downloads, unpacking) for seconds.
            self._registry.put(await asyncio.to_thread(self._new_spec, change))
        except (IronclawError, OSError) as exc:
            # Nothing of it took effect (the registry is written last): it failed, whatever the
            # cause. A full disk or an EIO left it "approved" with nothing applied, and every
            # later approval for the agent, a revocation too, was refused as waiting behind it
            # (found by a review).
            reason = str(exc) if isinstance(exc, IronclawError) else f"{type(exc).__name__}: {exc}"
            failed = transition(change, ChangeState.FAILED, note=reason)
            self._store.save_change(failed)
            self._audit.record("change.failed", "ironclawd", change=change.id, reason=reason)
            raise
        return await self._restart_and_record(change, **fields)

    async def _restart_and_record(self, change: Change, **fields: object) -> Change:
        from ironclawd.domain.changes import ChangeState, transition  # noqa: PLC0415

        # "applied" only once the sessions run the new spec (a revoked mount is gone from them):
        # a crash before that leaves it "approved", and resume() finishes the restart.
        restarted = await self._restart(change.agent)
        applied = transition(change, ChangeState.APPLIED)
        self._store.save_change(applied)
        self._audit.record("change.applied", "ironclawd", change=change.id, agent=change.agent,
                           restarted_sessions=restarted, **fields)  # fmt: skip
        log.info("change %s applied to agent %s; restarted sessions: %s", change.id,
                 change.agent, ", ".join(restarted) or "none",
                 extra=_change_fields(MessageId.CHANGE_APPLIED, change))  # fmt: skip
        return applied

    def _new_spec(self, change: Change) -> AgentSpec:
        from ironclawd.domain.changes import agent_view, canonical, parse_change  # noqa: PLC0415

        current = self._registry.get(change.agent)
        if canonical(agent_view(current)) != change.before:
            raise Conflict(
                f"agent '{change.agent}' changed since {change.id} was submitted; resubmit"
            )
        parsed = parse_change(change.kind, change.agent, change.payload)
        parsed.host_check(self._host)
        after = parsed.apply(current)
        parsed.prepare(self._host)
        return after

    async def resume(self) -> None:
        """After a restart: finish applying changes approved before the daemon died. A change
        whose new spec already reached the registry (the crash came between that write and
        "applied") only needs its sessions restarted; re-applying it would find the agent
        "changed since" and record as failed a change that took effect.

        READY comes before this runs, so an operator may approve meanwhile: with
        ``resume_pending`` approvals wait until this has run (a change approved first, built on
        one whose spec had reached the registry, made this one look "changed since"), and this
        runs under the lock approvals take (else a change approved then would be applied twice,
        and two applies could each check the agent against their own "before" and then both
        write it, the last silently undoing the first)."""
        try:
            async with self._lock:
                await self._resume_approved()
        finally:
            self._resumed.set()

    async def _resume_approved(self) -> None:
        from ironclawd.domain.changes import ChangeState, agent_view, canonical  # noqa: PLC0415

        for change in self._store.list_changes(ChangeState.APPROVED.value):
            # The approval's own record may be what the crash cut: name the approver here too.
            fields = {"resumed": True, "approved_by": change.decided_by}
            try:
                current = canonical(agent_view(self._registry.get(change.agent)))
                if current == change.after:
                    await self._restart_and_record(change, **fields)
                else:
                    await self._apply(change, **fields)
            except (Conflict, InvalidArgument, PolicyDenied) as exc:
                log.warning("change %s could not be applied after restart: %s", change.id, exc,
                            extra=_change_fields(MessageId.CHANGE_NOT_APPLIED, change))  # fmt: skip
            except (IronclawError, OSError) as exc:
                # One change that cannot be applied now must not stop the daemon from starting:
                # one whose spec was written stays approved and its restart is tried at the next
                # start; one that failed before that is recorded failed by _apply.
                log.error(
                    "change %s not applied after restart: %s",
                    change.id,
                    exc,
                    extra=_change_fields(MessageId.CHANGE_NOT_APPLIED, change),
                )
            else:
                log.info("change %s approved by %s before a restart: applied now", change.id,
                         change.decided_by)  # fmt: skip


def _retrieve(task: asyncio.Task[Change]) -> None:
    # The approver may have left: its refusal or failure is already audited, not "never
    # retrieved".
    if not task.cancelled():
        task.exception()


def _same_person(approver: str, submitter: str) -> bool:
    return approver.partition("(")[0] == submitter.partition("(")[0]


def _change_fields(event: MessageId, change: Change) -> dict[str, object]:
    return message_id(event, IRONCLAW_CHANGE=change.id, IRONCLAW_AGENT=change.agent)
