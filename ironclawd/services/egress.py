"""The egress broker (docs/architecture.md §6): the agent's only way to an external API.

Deny by default. A request must match one of its agent's rules; the broker resolves the name
itself (once), refuses the whole request if *any* answer is an address it may not reach, and
connects only to the address it validated, so a resolver that answers differently the second
time (DNS rebinding) gains nothing. Redirects are **not followed**: a 3xx goes back to the agent
with its Location, and fetching that is a new request checked from scratch. Agent-supplied
credentials are stripped; a rule may inject a host-held one. The broker asks for identity and
refuses any other content coding; the reason phrase is always the standard one. On a rule that
injects a credential, the request may not carry it (or a header of its name). Through any rule on
a host where some rule injects a credential, the answer is read whole (it is capped) and refused
if it carries any of those credentials in any form (domain/egress_secrets.py), masked besides.
Those checks run in the broker's own threads (services/egress_checks.py), never on the event
loop, and a request keeps its connection slot until its check has ended.
Caps: body sizes, one deadline for the whole exchange, requests per minute and connections per
session, connections in total (the last three counted by services/egress_budget.py). Every
decision is audited.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import ipaddress
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

from ironclawd import ratelog
from ironclawd.domain.addresses import METADATA, IPAddress, refusal_reason
from ironclawd.domain.agents import AgentSpec, effective_egress, find_agent
from ironclawd.domain.egress import (
    EgressDecision,
    EgressLimits,
    Target,
    check_header_size,
    check_method,
    credential_rules_on,
    match_rule,
    parse_url,
    prepare_headers,
)
from ironclawd.domain.egress_secrets import (
    SecretDetector,
    check_request,
    checked_body,
    checked_head,
)
from ironclawd.domain.message_ids import MessageId, message_id
from ironclawd.errors import (
    BudgetExceeded,
    InvalidArgument,
    IronclawError,
    PolicyDenied,
    ResponseRefused,
    UpstreamFailed,
)
from ironclawd.ports import (
    Clock,
    Credentials,
    Resolver,
    SessionLookup,
    Upstream,
    UpstreamRequest,
    UpstreamResponse,
)
from ironclawd.services.audit import RateWindow
from ironclawd.services.egress_budget import EgressBudget
from ironclawd.services.egress_checks import CheckThreads, host_detector, host_secrets

log = logging.getLogger("ironclawd.egress")
_DENIED = message_id(MessageId.EGRESS_DENIED)
CHUNK_BYTES = 64 * 1024

Recorder = Callable[[EgressDecision], None]


@dataclass(frozen=True)
class Head:
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class End:
    truncated: bool
    body_bytes: int


FetchEvent = Head | bytes | End


class EgressBroker:
    def __init__(
        self,
        *,
        sessions: SessionLookup,
        agents: Mapping[str, AgentSpec],
        resolver: Resolver,
        upstream: Upstream,
        credentials: Credentials,
        limits: EgressLimits,
        clock: Clock,
        record: Recorder,
    ) -> None:
        self._sessions = sessions
        self._agents = agents
        self._resolver = resolver
        self._upstream = upstream
        self._credentials = credentials
        self._limits = limits
        self._record = record
        self._clock = clock
        self._budget = EgressBudget(limits, clock)
        # Requests refused for the session's rate are the one decision a box can cause without
        # bound: their records are metered here (every other decision is within that rate).
        self._over_rate = RateWindow(clock)
        self._checks = CheckThreads()

    def close(self) -> None:
        """Stop the check threads (at shutdown)."""
        self._checks.close()

    @property
    def timeout_seconds(self) -> float:
        return self._limits.timeout_seconds

    def _agent(self, sid: str) -> AgentSpec:
        return find_agent(self._agents, self._sessions.get(sid).agent)

    def has_grants(self, sid: str) -> bool:
        """Whether this session's agent has any egress rule (else it gets no egress.sock)."""
        try:
            return bool(effective_egress(self._agent(sid)))
        except IronclawError:
            return False

    def forget(self, sid: str) -> None:
        self._budget.forget(sid)
        self._over_rate.forget(sid)

    async def fetch(
        self,
        sid: str,
        method: str,
        url: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
    ) -> AsyncGenerator[FetchEvent, None]:
        """Check, then perform one request; yields the head, body chunks, then the end."""
        started = self._clock.monotonic()
        deadline = started + self._limits.timeout_seconds
        audit = _Audit(sid, method[:16], url)
        detector = SecretDetector(())
        try:
            # Every request counts against the session's rate, a denied one too: each is a
            # record in the audit log, and a box probing hosts and paths is slowed as any.
            self._budget.admit_request(sid)
            # The slot is taken before the checks: they count as the request in flight.
            async with self._budget.slot(sid):
                request, detector = await self._admit(sid, method, url, headers, body=body,
                                                      audit=audit)  # fmt: skip
                audit.allowed()
                async for event in self._exchange(request, detector, deadline, audit):
                    yield event
        except ResponseRefused as exc:
            audit.verdict = "failed"
            audit.note(str(exc))
            raise
        except (PolicyDenied, InvalidArgument) as exc:
            audit.verdict, audit.reason = "denied", audit.withheld or str(exc)
            audit.over_rate = isinstance(exc, BudgetExceeded)
            raise
        except (UpstreamFailed, TimeoutError) as exc:
            audit.verdict = "failed"
            audit.reason = exc.audit if isinstance(exc, UpstreamFailed) else "timed out"
            if isinstance(exc, UpstreamFailed) and detector.find(audit.reason.encode()):
                # An error text may quote what the upstream sent (a malformed status line).
                audit.reason = f"{audit.host}: the upstream broke off (its error text withheld)"
                raise UpstreamFailed(audit.reason) from None
            if isinstance(exc, TimeoutError):
                raise UpstreamFailed(
                    f"{audit.host}: no complete answer within {self._limits.timeout_seconds:g} s"
                ) from None
            raise
        except BaseException as exc:  # the agent hung up (cancelled), or a bug: still audited
            if audit.verdict == "allowed" and not audit.reason:
                audit.reason = f"aborted: {type(exc).__name__}"
            raise
        finally:
            audit.duration_ms = (self._clock.monotonic() - started) * 1e3
            self._audit(audit.decision(), over_rate=audit.over_rate)

    async def _admit(
        self,
        sid: str,
        method: str,
        url: str,
        headers: Sequence[tuple[str, str]],
        *,
        body: bytes,
        audit: _Audit,
    ) -> tuple[UpstreamRequest, SecretDetector]:
        method = check_method(method)
        audit.method = method
        target = parse_url(url)
        audit.target(target)
        rules = effective_egress(self._agent(sid))
        rule = match_rule(rules, method, target)
        audit.rule = rule.describe()
        if len(body) > self._limits.max_request_bytes:
            raise PolicyDenied(
                f"egress: request body of {len(body)} bytes exceeds the cap of "
                f"{self._limits.max_request_bytes}"
            )
        check_header_size(headers)  # before any header is looked at
        injected = None
        # The answer is checked for the credentials of every rule on the host, not only this
        # rule's: an upstream that keeps a credential request (a request log, a "last request"
        # endpoint) handed it back through a plain rule on the same host (found by a review).
        secrets = host_secrets(self._credentials, credential_rules_on(rules, target.host), rule)
        detector = host_detector(secrets)
        if detector and detector.find(target.path.encode()):  # nor may the audit record keep it
            audit.path = "[withheld: it carries the credential]"
        if rule.credential:
            await self._checks.run(
                functools.partial(check_request, detector, target.path, target.query, headers,
                                  body)
            )  # fmt: skip
            injected = (rule.credential_header, rule.credential_format.format(secrets[rule]))
        prepared = prepare_headers(headers, target, method, len(body), injected)
        if prepared.stripped:
            audit.note(f"stripped {', '.join(sorted(set(prepared.stripped)))}")
        address = await self._resolve_checked(target, audit)
        audit.address = str(address)
        request = UpstreamRequest(
            scheme=target.scheme,
            host=target.host,
            address=str(address),
            port=target.port,
            method=method,
            target=target.request_target,
            headers=prepared.headers,
            body=body,
            connect_timeout=self._limits.connect_timeout_seconds,
        )
        return request, detector

    async def _resolve_checked(self, target: Target, audit: _Audit) -> IPAddress:
        return await resolve_checked(self._resolver, target, self._limits, audit.withhold)

    async def _exchange(
        self, request: UpstreamRequest, detector: SecretDetector, deadline: float, audit: _Audit
    ) -> AsyncIterator[FetchEvent]:
        audit.bytes_out = len(request.body)
        response: UpstreamResponse = await asyncio.wait_for(
            self._upstream.send(request), self._remaining(deadline)
        )
        try:
            audit.status = response.status
            head_check = functools.partial(checked_head, response.status, response.headers,
                                           detector)  # fmt: skip
            # Without a credential on the host it only reads the coding: no thread for that.
            reason, headers = await self._checks.run(head_check) if detector else head_check()
            head = Head(response.status, reason, headers)
            cap = self._limits.max_response_bytes
            if detector:
                # Read whole (it is capped) and checked before a byte is released: a response
                # carrying the credential is refused entirely, and the decoders see it at once.
                body, truncated = await self._read_all(response, cap, deadline, audit)
                body = await self._checks.run(
                    functools.partial(checked_body, body, truncated, detector, cap)
                )
                yield head
                for start in range(0, len(body), CHUNK_BYTES):
                    yield body[start : start + CHUNK_BYTES]
                yield End(truncated, audit.bytes_in)
                return
            yield head
            truncated = False
            while not truncated:
                chunk = await asyncio.wait_for(response.read_chunk(), self._remaining(deadline))
                if not chunk:
                    break
                chunk, truncated = self._capped(chunk, cap, audit)
                if chunk:
                    yield chunk
            yield End(truncated, audit.bytes_in)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(response.close(), 5)

    async def _read_all(
        self, response: UpstreamResponse, cap: int, deadline: float, audit: _Audit
    ) -> tuple[bytes, bool]:
        parts: list[bytes] = []
        truncated = False
        while not truncated:
            chunk = await asyncio.wait_for(response.read_chunk(), self._remaining(deadline))
            if not chunk:
                break
            chunk, truncated = self._capped(chunk, cap, audit)
            parts.append(chunk)
        return b"".join(parts), truncated

    @staticmethod
    def _capped(chunk: bytes, cap: int, audit: _Audit) -> tuple[bytes, bool]:
        truncated = audit.bytes_in + len(chunk) > cap
        if truncated:
            chunk = chunk[: cap - audit.bytes_in]
            audit.note(f"response truncated at the cap of {cap} bytes")
        audit.bytes_in += len(chunk)
        return chunk, truncated

    def _remaining(self, deadline: float) -> float:
        remaining = deadline - self._clock.monotonic()
        if remaining <= 0:
            raise TimeoutError
        return remaining

    def _audit(self, decision: EgressDecision, *, over_rate: bool = False) -> None:
        level = logging.INFO if decision.verdict == "allowed" else logging.WARNING
        # A box decides how many requests it makes: its lines go through the shared throttle
        # (per session and verdict); every decision still reaches the audit log below.
        ratelog.AGENT_LOG.log(
            log,
            level,
            decision.sid,
            f"egress {decision.verdict}",
            "egress session %s: %s %s %s:%d%s -> %s%s (%s) status %d, %d bytes in, %d out, "
            "%.0f ms",
            decision.sid, decision.verdict, decision.method, decision.host, decision.port,
            decision.path, decision.address or "-", f" [{decision.rule}]" if decision.rule else "",
            decision.reason or "ok", decision.status, decision.bytes_in, decision.bytes_out,
            decision.duration_ms,
            extra={"IRONCLAW_SID": decision.sid, "IRONCLAW_EGRESS_VERDICT": decision.verdict,
                   "IRONCLAW_METHOD": decision.method, "IRONCLAW_HOST": decision.host,
                   "IRONCLAW_ADDRESS": decision.address, "IRONCLAW_PORT": decision.port,
                   "IRONCLAW_PATH": decision.path, "IRONCLAW_RULE": decision.rule,
                   "IRONCLAW_REASON": decision.reason, "IRONCLAW_STATUS": decision.status,
                   "IRONCLAW_BYTES_IN": decision.bytes_in,
                   "IRONCLAW_BYTES_OUT": decision.bytes_out,
                   "IRONCLAW_DURATION_MS": round(decision.duration_ms, 1),
                   **(_DENIED if decision.verdict == "denied" else {})},
        )  # fmt: skip
        if over_rate:
            dropped = self._over_rate.admit(decision.sid)
            if dropped is None:
                return
            if dropped:
                decision = dataclasses.replace(decision, unrecorded_before=dropped)
        try:
            self._record(decision)
        except Exception as exc:  # the audit sink must not turn a decision into a crash
            log.error("egress: recording a decision failed: %s", exc)


async def resolve_checked(
    resolver: Resolver,
    target: Target,
    limits: EgressLimits,
    withhold: Callable[[str], None] | None = None,
) -> IPAddress:
    """The one address to connect to for ``target``; PolicyDenied if any answer may not be
    reached (also the webhook channel's outbound rule: services/webhook_delivery.py). With
    ``withhold``, a refused answer that could map the inside network (a private or CGNAT
    address, say) is named only to ``withhold`` (the audit), not in the error."""
    if target.address is not None:
        answers: list[IPAddress] = [target.address]
    else:
        raw = await asyncio.wait_for(
            resolver.resolve(target.host, target.port), limits.connect_timeout_seconds
        )
        try:
            answers = [ipaddress.ip_address(a.split("%", 1)[0]) for a in raw]
        except ValueError as exc:
            raise UpstreamFailed(f"resolving {target.host}: bad answer: {exc}") from None
        if not answers:
            raise UpstreamFailed(f"resolving {target.host}: no addresses")
    for answer in answers:
        reason = refusal_reason(answer, limits.internal_cidrs)
        if reason is not None:
            # One bad answer spoils the name: a resolver that mixes a loopback answer in
            # with good ones is hostile, and which answer a client picks is not ours to bet on.
            said = f"egress: {target.host} resolves to {answer}, a {reason}; refused"
            if withhold is None or target.address is not None or _well_known(answer):
                raise PolicyDenied(said)
            # The agent asked for a name: its internal answers (10.x.y.z) are the operator's,
            # not the agent's to learn (found by a review).
            withhold(said)
            raise PolicyDenied(
                f"egress: {target.host} resolves to a refused address (a {reason}); refused"
            )
    return answers[0]


def _well_known(address: IPAddress) -> bool:
    """An address the same on every network: naming it tells nothing of the inside one."""
    return address.is_loopback or address.is_unspecified or address in METADATA


class _Audit:
    """The decision being built while a request is checked and served."""

    def __init__(self, sid: str, method: str, url: str) -> None:
        self.sid = sid
        self.method = method
        self.host = url[:200]  # until the URL parses: what was asked for, cut short
        self.port = 0
        self.path = ""
        self.verdict = "denied"
        self.reason = ""
        self.address = ""
        self.rule = ""
        self.status = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.duration_ms = 0.0
        self.over_rate = False  # refused for the session's rate (its record is metered)
        self.withheld = ""  # a refusal as the audit keeps it, told to the agent without details

    def target(self, target: Target) -> None:
        # The path, never the query: queries carry tokens often enough.
        self.host, self.port, self.path = target.host, target.port, target.path[:512]

    def allowed(self) -> None:
        self.verdict = "allowed"

    def withhold(self, reason: str) -> None:
        self.withheld = reason

    def note(self, text: str) -> None:
        self.reason = f"{self.reason}; {text}" if self.reason else text

    def decision(self) -> EgressDecision:
        return EgressDecision(
            sid=self.sid, method=self.method, host=self.host, port=self.port, path=self.path,
            verdict=self.verdict, reason=self.reason, address=self.address, rule=self.rule,
            status=self.status, bytes_in=self.bytes_in, bytes_out=self.bytes_out,
            duration_ms=self.duration_ms,
        )  # fmt: skip
