"""``persona``: replace the agent's system prompt."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.kinds.base import ChangeKind, only, text

MAX_PERSONA = 16_000


@dataclass(frozen=True)
class Persona:
    persona: str


class PersonaKind(ChangeKind[Persona]):
    name = "persona"

    def parse(self, payload: Mapping[str, Any]) -> Persona:
        only(payload, self.name, {"persona"})
        return Persona(text(payload, "persona", MAX_PERSONA))

    def dump(self, payload: Persona) -> dict[str, Any]:
        return {"persona": payload.persona}

    def apply(self, spec: AgentSpec, payload: Persona) -> AgentSpec:
        return dataclasses.replace(spec, persona=payload.persona)

    def view(self, spec: AgentSpec) -> dict[str, Any]:
        return {"persona": spec.persona}


KIND = PersonaKind()
