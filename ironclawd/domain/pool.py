"""The warm pool's rules (issue 17): how many pre-started sandboxes each agent should hold, and
what to do next. Pure values; the service that acts on them is ``services/pool.py``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Below this much MemAvailable (proc(5)) the pool stops refilling and gives sandboxes back.
DEFAULT_MIN_AVAILABLE_BYTES = 1024 * 1024 * 1024


@dataclass(frozen=True)
class PoolConfig:
    """``[pool]``: ``size`` pre-started sandboxes for each agent of ``agents`` (0: no pool)."""

    size: int = 0
    agents: tuple[str, ...] = ()
    min_available_bytes: int = DEFAULT_MIN_AVAILABLE_BYTES

    def target(self, agent: str) -> int:
        return self.size if agent in self.agents else 0


@dataclass(frozen=True)
class Step:
    """One thing the pool does next: ``fill`` starts a sandbox of ``agent``, ``drop`` destroys
    one of its ready ones, ``wait`` does nothing until woken."""

    action: str  # "fill" | "drop" | "wait"
    agent: str = ""


WAIT = Step("wait")


def next_step(
    config: PoolConfig,
    known_agents: Mapping[str, object],
    ready: Mapping[str, int],
    starting: Mapping[str, int],
    available_bytes: int,
) -> Step:
    """What to do next, one sandbox at a time (a refill never starts sandboxes in parallel:
    the host's cores serve sessions first). Drops come first: a sandbox of an agent no longer
    pooled (or gone), beyond ``size``, or any at all while memory is short."""
    for agent, count in sorted(ready.items()):
        if count > 0 and (agent not in known_agents or count > config.target(agent)):
            return Step("drop", agent)
    short = available_bytes < config.min_available_bytes
    if short:
        fullest = max(sorted(ready.items()), key=lambda item: item[1], default=("", 0))
        return Step("drop", fullest[0]) if fullest[1] > 0 else WAIT
    if any(starting.values()):
        return WAIT
    for agent in config.agents:
        if agent in known_agents and ready.get(agent, 0) < config.target(agent):
            return Step("fill", agent)
    return WAIT
