"""The model proxy (ARCHITECTURE.md §5): one turn of the agent's model, with the key injected
here, the persona and tools fixed by the host, budgets keyed by the session the socket belongs
to, secrets redacted from everything returned, and every call audited (never its content)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

from ironclawd.domain.agents import AgentSpec, find_agent
from ironclawd.domain.model import (
    Budget,
    Chunk,
    Completion,
    Message,
    Redactor,
    ToolDef,
    check_messages,
    enabled_tools,
)
from ironclawd.domain.tools import tool_defs
from ironclawd.errors import IronclawError, NotFound
from ironclawd.providers.base import Provider, ProviderError
from ironclawd.services.sessions import SessionService
from ironclawd.store.credentials import CredentialStore

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
        sessions: SessionService,
        agents: dict[str, AgentSpec],
        providers: dict[str, Provider],
        credentials: CredentialStore,
        base_urls: dict[str, str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sessions = sessions
        self._agents = agents
        self._providers = providers
        self._credentials = credentials
        self._base_urls = base_urls
        self._clock = clock
        self._budgets: dict[str, Budget] = {}

    def _agent(self, sid: str) -> AgentSpec:
        return find_agent(self._agents, self._sessions.get(sid).agent)

    def profile(self, sid: str) -> Profile:
        agent = self._agent(sid)
        return Profile(agent.name, agent.persona, tool_defs(agent.tools), agent.max_tool_rounds)

    def _budget(self, key: str, rpm: int, tpd: int) -> Budget:
        return self._budgets.setdefault(key, Budget(rpm, tpd))

    async def complete(
        self, sid: str, messages: Iterable[Message], tools: Iterable[ToolDef], max_tokens: int
    ) -> AsyncIterator[Chunk]:
        agent = self._agent(sid)
        provider = self._providers.get(agent.provider)
        if provider is None:
            raise NotFound(f"agent {agent.name}: unknown model provider '{agent.provider}'")
        now = self._clock()
        budgets = (
            self._budget(f"session:{sid}", agent.session_requests_per_minute,
                         agent.session_tokens_per_day),
            self._budget(f"agent:{agent.name}", agent.requests_per_minute, agent.tokens_per_day),
        )  # fmt: skip
        for budget, what in zip(budgets, (f"session {sid}", f"agent {agent.name}"), strict=True):
            budget.admit(now, what)
        key = self._credentials.get(agent.credential) if agent.credential else ""
        redactor = Redactor([key, *self._credentials.all_values()])
        completion = Completion(
            system=agent.persona,
            messages=check_messages(messages),
            tools=enabled_tools(tools, tool_defs(agent.tools)),
            model=agent.model,
            max_tokens=min(max_tokens or agent.max_tokens, agent.max_tokens),
        )
        base_url = agent.base_url or self._base_urls.get(agent.provider, "")
        tokens = [0, 0]
        status = "ok"
        started = time.monotonic()
        try:
            async for chunk in _redacted(provider.stream(completion, key, base_url), redactor):
                if chunk.usage is not None:
                    tokens = [chunk.usage[0], chunk.usage[1]]
                else:
                    yield chunk
            yield Chunk(usage=(tokens[0], tokens[1]))
        except ProviderError as exc:
            status = "upstream-error"
            raise ProviderError(redactor.scrub(str(exc))) from None
        except IronclawError:
            status = "error"
            raise
        except Exception as exc:  # httpx transport errors and the like
            status = "transport-error"
            raise ProviderError(
                f"{agent.provider}: {redactor.scrub(type(exc).__name__ + ': ' + str(exc))}"
            ) from None
        finally:
            for budget in budgets:
                budget.spend(self._clock(), tokens[0] + tokens[1])
            log.info(
                "model call session %s agent %s provider %s model %s: %s, %d in / %d out "
                "tokens, %.0f ms",
                sid, agent.name, agent.provider, agent.model, status, tokens[0], tokens[1],
                (time.monotonic() - started) * 1e3,
                extra={"IRONCLAW_SID": sid, "IRONCLAW_AGENT": agent.name,
                       "IRONCLAW_PROVIDER": agent.provider, "IRONCLAW_MODEL": agent.model,
                       "IRONCLAW_STATUS": status, "IRONCLAW_TOKENS_IN": tokens[0],
                       "IRONCLAW_TOKENS_OUT": tokens[1]},
            )  # fmt: skip


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
            args = redactor.scrub(chunk.tool_call.arguments_json)
            yield Chunk(tool_call=dataclasses.replace(chunk.tool_call, arguments_json=args))
        else:
            yield chunk
    tail = redactor.flush()
    if tail:
        yield Chunk(text=tail)
