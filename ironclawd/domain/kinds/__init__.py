"""Every change kind, one module each: the registry the gateway, config and the API read.

Adding a kind is its module (a ``ChangeKind`` subclass and its frozen payload, see
``base.py``) and its line below; docs/architecture.md "Adding a change kind" has the steps.
"""

from __future__ import annotations

from typing import Any

from ironclawd.domain.kinds import (
    create_agent,
    egress,
    mcp,
    mounts,
    packages,
    permissions,
    persona,
    skills,
    tools,
    wiring,
)
from ironclawd.domain.kinds.base import ChangeKind, HostChecks, RefusedKind

__all__ = ["KINDS", "ChangeKind", "HostChecks", "RefusedKind", "creates_agent"]


def _registry(*kinds: ChangeKind[Any]) -> dict[str, ChangeKind[Any]]:
    out: dict[str, ChangeKind[Any]] = {}
    for kind in kinds:
        if kind.name in out:
            raise ValueError(f"change kind {kind.name} registered twice")
        out[kind.name] = kind
    return out


# name -> kind. The order is the order shown in messages and in docs/config.md.
KINDS = _registry(
    persona.KIND, tools.KIND, packages.KIND, wiring.KIND, permissions.KIND, mounts.KIND,
    egress.KIND, skills.KIND, mcp.KIND, create_agent.KIND,
)  # fmt: skip


def creates_agent(name: str) -> bool:
    """Whether changes of kind ``name`` create their target agent (False for unknown kinds)."""
    kind = KINDS.get(name)
    return kind is not None and kind.creates_agent
