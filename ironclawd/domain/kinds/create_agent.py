"""``create_agent``: a new agent with a persona, tools, a provider and a model."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.kinds.base import ChangeKind, only, text, tool_list
from ironclawd.domain.kinds.persona import MAX_PERSONA
from ironclawd.domain.providers import DEFAULT_PROVIDER, PROVIDERS, provider_choices
from ironclawd.errors import InvalidArgument

DEFAULT_MODEL = "mock-1"


@dataclass(frozen=True)
class NewAgent:
    persona: str
    tools: tuple[str, ...]
    provider: str
    model: str


class CreateAgentKind(ChangeKind[NewAgent]):
    name = "create_agent"
    creates_agent = True

    def parse(self, payload: Mapping[str, Any]) -> NewAgent:
        only(payload, self.name, {"persona", "tools", "provider", "model"})
        persona = text(payload, "persona", MAX_PERSONA)
        tools = tool_list(payload) if "tools" in payload else ()
        provider = payload.get("provider", DEFAULT_PROVIDER)
        if not isinstance(provider, str) or provider not in PROVIDERS:
            raise InvalidArgument(f"payload.provider: expected {provider_choices()}")
        model = text(payload, "model", 200) if "model" in payload else DEFAULT_MODEL
        return NewAgent(persona, tools, provider, model)

    def dump(self, payload: NewAgent) -> dict[str, Any]:
        out = dataclasses.asdict(payload)
        out["tools"] = list(payload.tools)
        return out

    def apply(self, spec: AgentSpec, payload: NewAgent) -> AgentSpec:
        return dataclasses.replace(
            spec, persona=payload.persona, tools=payload.tools, provider=payload.provider,
            model=payload.model,
        )  # fmt: skip

    def view(self, spec: AgentSpec) -> dict[str, Any]:
        # The fields set only when an agent is created (persona and tools have kinds of their own).
        return {"name": spec.name, "provider": spec.provider, "model": spec.model}


KIND = CreateAgentKind()
