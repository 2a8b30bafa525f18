"""The model proxy (docs/architecture.md §5): one turn of the agent's model, with the key injected
here, the persona and tools fixed by the host, budgets keyed by the session the socket belongs
to, secrets redacted from everything returned, and every call audited (never its content)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass

from ironclawd import ratelog
from ironclawd.domain.agents import AgentSpec, effective_tools, find_agent
from ironclawd.domain.mcp_grants import mcp_tool_defs
from ironclawd.domain.model import (
    Budget,
    Chunk,
    Completion,
    Ending,
    Message,
    Redactor,
    ToolCall,
    ToolDef,
    check_messages,
    enabled_tools,
    estimated_input_tokens,
    tokens_to_charge,
)
from ironclawd.domain.skill_prompt import system_prompt
from ironclawd.domain.tools import tool_defs
from ironclawd.errors import BudgetExceeded, IronclawError, NotFound, ProviderError
from ironclawd.ports import AuditSink, Clock, Credentials, Provider, SessionLookup
from ironclawd.services.audit import Throttled
from ironclawd.services.own_secrets import own_secrets

log = logging.getLogger("ironclawd.model")


@dataclass(frozen=True)
class Profile:
    agent: str
    persona: str
    tools: tuple[ToolDef, ...]
    max_tool_rounds: int


class ModelProxy:
    def __init__(
        self,
        *,
        sessions: SessionLookup,
        agents: Mapping[str, AgentSpec],
        providers: dict[str, Provider],
        credentials: Credentials,
        base_urls: dict[str, str],
        audit: AuditSink,
        clock: Clock,
    ) -> None:
        self._sessions = sessions
        self._agents = agents
        self._providers = providers
        self._credentials = credentials
        self._base_urls = base_urls
        self._clock = clock
        self._budgets: dict[str, Budget] = {}
        self._audit = audit
        self._refusals = Throttled(audit, clock)

    def _agent(self, sid: str) -> AgentSpec:
        return find_agent(self._agents, self._sessions.get(sid).agent)

    def profile(self, sid: str) -> Profile:
        agent = self._agent(sid)
        tools = _host_tools(agent)
        persona = system_prompt(agent.persona, agent.skills)
        return Profile(agent.name, persona, tools, agent.max_tool_rounds)

    def _budget(self, key: str, rpm: int, tpd: int) -> Budget:
        budget = self._budgets.get(key)
        if budget is None:
            budget = self._budgets[key] = Budget(rpm, tpd)
        elif (budget.requests_per_minute, budget.tokens_per_day) != (rpm, tpd):
            # An approved change moved the agent's limits: they hold from its next call on,
            # what was spent before still counted. (The first limits were kept for ever.)
            budget.set_limits(rpm, tpd)
        return budget

    def forget(self, sid: str) -> None:
        """Drop what is kept for a removed session (its budget, its refusal count): they were
        kept for the daemon's life, and a new session given the same id took them over."""
        self._budgets.pop(f"session:{sid}", None)
        self._refusals.forget(sid)

    def _secrets(self, agent: AgentSpec, key: str) -> list[str]:
        """The values to mask in what returns: the key in use and the agent's own credentials."""
        # The key in use is read once per call already: not read again.
        return [key, *own_secrets(self._credentials, agent, besides=agent.credential)]

    def _admit(self, sid: str, agent: AgentSpec) -> tuple[Budget, ...]:
        """The session's and the agent's budgets, one request counted in each; BudgetExceeded
        (recorded at a bounded rate) if either is spent."""
        now = self._clock.time()
        budgets = (
            self._budget(f"session:{sid}", agent.session_requests_per_minute,
                         agent.session_tokens_per_day),
            self._budget(f"agent:{agent.name}", agent.requests_per_minute, agent.tokens_per_day),
        )  # fmt: skip
        try:
            # Every budget is checked before any is charged: a call refused by the agent's
            # budget must not use up the session's, nor one refused by the session's the agent's.
            for budget, what in zip(budgets, (f"session {sid}", f"agent {agent.name}"),
                                    strict=True):  # fmt: skip
                budget.check(now, what)
        except BudgetExceeded:
            # A box can loop on a spent budget: these are recorded and logged at a bounded rate.
            _audit(self._refusals, sid, agent=agent, status="budget-exceeded", tokens=(0, 0),
                   charged=0, took=0.0)  # fmt: skip
            raise
        for budget in budgets:
            budget.record(now)
        return budgets

    async def complete(
        self, sid: str, messages: Iterable[Message], tools: Iterable[ToolDef], max_tokens: int
    ) -> AsyncIterator[Chunk]:
        agent = self._agent(sid)
        provider = self._providers.get(agent.provider)
        if provider is None:
            raise NotFound(f"agent {agent.name}: unknown model provider '{agent.provider}'")
        budgets = self._admit(sid, agent)
        key = self._credentials.get(agent.credential) if agent.credential else ""
        redactor = Redactor(self._secrets(agent, key))
        completion = _completion(agent, messages, tools, max_tokens)
        base_url = agent.base_url or self._base_urls.get(agent.provider, "")
        # Reserved from here to the end of the call, and with no await since the check: calls
        # running together can no longer all pass it before any is charged.
        call = _Call(budgets, estimated_input_tokens(completion), completion.max_tokens)
        for budget in budgets:
            budget.reserve(call.reserved)
        status = "abandoned"  # until it ends: the agent went away, or the call ran out of time
        started = self._clock.monotonic()
        try:
            async for chunk in _redacted(provider.stream(completion, key, base_url), redactor):
                if chunk.usage is not None:
                    call.reported = chunk.usage  # the latest replaces any before it
                else:
                    call.streamed += _chars(chunk)
                    yield chunk
            # Before the last yield: an agent that leaves now left a call that ended.
            status = call.ending = "ok"
            yield Chunk(usage=call.reported or (0, 0))
        except ProviderError as exc:
            status = call.ending = "upstream-error"
            raise ProviderError(_clip(redactor.scrub(str(exc)))) from None
        except IronclawError:
            status = "error"
            raise
        except Exception as exc:  # httpx transport errors and the like
            status = "transport-error"
            if _never_connected(exc):
                call.ending = "upstream-error"  # nothing reached the provider: nothing billed
            detail = redactor.scrub(type(exc).__name__ + ": " + str(exc))
            raise ProviderError(_clip(f"{agent.provider}: {detail}")) from None
        finally:
            charged = call.settle(self._clock.time())
            tokens = call.reported or (0, 0)
            took = self._clock.monotonic() - started
            _after_answer(lambda: _audit(self._audit, sid, agent=agent, status=status,
                                         tokens=tokens, charged=charged, took=took))  # fmt: skip


@dataclass
class _Call:
    """One admitted call's hold on its budgets, and what is known of its use as it streams."""

    budgets: tuple[Budget, ...]
    input_estimate: int
    max_tokens: int
    reported: tuple[int, int] | None = None  # the provider's latest usage (input, output)
    streamed: int = 0  # characters of text and tool calls passed on
    ending: Ending = "abandoned"  # until the stream ends or the provider says no

    @property
    def reserved(self) -> int:
        return self.input_estimate + self.max_tokens

    def settle(self, now: float) -> int:
        """Release the reservation and charge the call; the tokens charged. Runs in the call's
        ``finally`` and never raises (int arithmetic and deque appends): an exception there
        would replace the one the call ended with, or break the close of an abandoned stream."""
        charged = tokens_to_charge(
            self.ending,
            self.reported,
            input_estimate=self.input_estimate,
            max_tokens=self.max_tokens,
            streamed_chars=self.streamed,
        )
        for budget in self.budgets:
            budget.release(self.reserved)
            budget.spend(now, charged)
        return charged


def _completion(
    agent: AgentSpec, messages: Iterable[Message], tools: Iterable[ToolDef], max_tokens: int
) -> Completion:
    """What goes upstream: the agent's messages, the host's persona and tool definitions."""
    return Completion(
        # The persona and a host-written list of the installed skills (their descriptions
        # cleaned and quoted: an author's words, never the host's instructions).
        system=system_prompt(agent.persona, agent.skills),
        messages=check_messages(messages),
        tools=enabled_tools(tools, _host_tools(agent)),
        model=agent.model,
        max_tokens=min(max_tokens or agent.max_tokens, agent.max_tokens),
    )


def _after_answer(record: Callable[[], None]) -> None:
    """Run ``record`` (the call's audit record and journal line, ~0.1 ms) on the event loop's
    next turn: the end of this generator is what releases the answer's last event (the
    servicer holds text until then), so recording first kept the agent waiting for it. The
    audit record was already written by a batching thread, not before the answer; only the
    order of the two in the loop changes. Outside a running loop it runs at once."""
    try:
        asyncio.get_running_loop().call_soon(record)
    except RuntimeError:
        record()


def _never_connected(exc: Exception) -> bool:
    """Whether ``exc`` is httpx's for a connection to the provider that was never made (the
    request was not sent, so nothing can have been billed). Other transport errors may come
    after the request went: those calls are charged as abandoned ones."""
    import httpx  # noqa: PLC0415 (loaded already: the call went through it)

    never = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout,
             httpx.UnsupportedProtocol, httpx.InvalidURL)  # fmt: skip
    return isinstance(exc, never)


def _chars(chunk: Chunk) -> int:
    """The characters of answer in ``chunk`` (what a call that reports no usage is charged
    for, a quarter of a token each)."""
    call = chunk.tool_call
    if call is None:
        return len(chunk.text)
    return len(call.id) + len(call.name) + len(call.arguments_json)


def _host_tools(agent: AgentSpec) -> tuple[ToolDef, ...]:
    """The tools the agent may offer, defined by the host: its own and its skills', and its
    granted MCP tools with the definitions pinned at approval."""
    return (*tool_defs(effective_tools(agent)), *mcp_tool_defs(agent))


MAX_ERROR_CHARS = 2000


def _clip(message: str) -> str:
    """Cut an (already scrubbed) error message: cutting before scrubbing could leave the first
    part of a secret that straddles the cut, which no longer matches the whole secret."""
    return message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + " [...]"


def _audit(
    audit: AuditSink | Throttled,
    sid: str,
    *,
    agent: AgentSpec,
    status: str,
    tokens: tuple[int, int],
    charged: int,
    took: float,
) -> None:
    """One journal and one audit record per model call, never its content or key; refused
    calls (``audit`` is then a Throttled) at a bounded rate. ``tokens`` are what the provider
    reported; ``charged`` what the budgets were charged (more for an abandoned call)."""
    fields = dict(agent=agent.name, provider=agent.provider, model=agent.model, status=status,
                  tokens_in=tokens[0], tokens_out=tokens[1], tokens_charged=charged,
                  ms=round(took * 1e3, 1))  # fmt: skip
    if isinstance(audit, Throttled):
        audit.record(sid, "model.call", f"session:{sid}", **fields)
    else:
        audit.record_soon("model.call", f"session:{sid}", **fields)
    args = (sid, agent.name, agent.provider, agent.model, status, tokens[0], tokens[1], took * 1e3)
    message = (
        "model call session %s agent %s provider %s model %s: %s, %d in / %d out tokens, %.0f ms"
    )
    extra = {"IRONCLAW_SID": sid, "IRONCLAW_AGENT": agent.name,
             "IRONCLAW_PROVIDER": agent.provider, "IRONCLAW_MODEL": agent.model,
             "IRONCLAW_STATUS": status, "IRONCLAW_TOKENS_IN": tokens[0],
             "IRONCLAW_TOKENS_OUT": tokens[1], "IRONCLAW_TOKENS_CHARGED": charged,
             "IRONCLAW_DURATION_MS": round(took * 1e3, 1)}  # fmt: skip
    if isinstance(audit, Throttled):
        ratelog.AGENT_LOG.log(log, logging.INFO, sid, f"model {status}", message, *args,
                              extra=extra)  # fmt: skip
    else:
        log.info(message, *args, extra=extra)


async def _redacted(stream: AsyncIterator[Chunk], redactor: Redactor) -> AsyncIterator[Chunk]:
    """The provider's stream with every configured secret masked, even across chunks."""
    async for chunk in stream:
        if chunk.text:
            text = redactor.feed(chunk.text)
            if text:
                yield Chunk(text=text)
            continue
        tail = redactor.flush()
        if tail:
            yield Chunk(text=tail)
        if chunk.tool_call is not None:
            call = chunk.tool_call
            yield Chunk(
                tool_call=ToolCall(
                    id=redactor.scrub(call.id),
                    name=redactor.scrub(call.name),
                    arguments_json=redactor.scrub_json(call.arguments_json),
                )
            )
        elif chunk.stop_reason:
            yield Chunk(stop_reason=redactor.scrub(chunk.stop_reason))
        else:
            yield chunk
    tail = redactor.flush()
    if tail:
        yield Chunk(text=tail)
