"""``tools``: replace the agent's tools (names from the catalogue, ironclawd/domain/tools.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.kinds.base import ChangeKind, only, tool_list


@dataclass(frozen=True)
class Tools:
    tools: tuple[str, ...]  # known tools, each once, in the order asked


class ToolsKind(ChangeKind[Tools]):
    name = "tools"

    def parse(self, payload: Mapping[str, Any]) -> Tools:
        only(payload, self.name, {"tools"})
        return Tools(tool_list(payload))

    def dump(self, payload: Tools) -> dict[str, Any]:
        return {"tools": list(payload.tools)}

    def apply(self, spec: AgentSpec, payload: Tools) -> AgentSpec:
        return dataclasses.replace(spec, tools=payload.tools)

    def view(self, spec: AgentSpec) -> dict[str, Any]:
        return {"tools": list(spec.tools)}


KIND = ToolsKind()
