"""The egress broker's counts (docs/architecture.md §6): requests per minute and connections in
flight per session, and connections in the broker in total."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ironclawd.domain.egress import EgressLimits
from ironclawd.errors import BudgetExceeded
from ironclawd.ports import Clock


@dataclass
class _SessionUse:
    requests: collections.deque[float] = field(default_factory=collections.deque)
    connections: int = 0


class EgressBudget:
    """What each session has used of ``limits``; BudgetExceeded when a request would exceed it."""

    def __init__(self, limits: EgressLimits, clock: Clock) -> None:
        self._limits = limits
        self._clock = clock
        self._use: dict[str, _SessionUse] = {}
        self._connections = 0

    def forget(self, sid: str) -> None:
        self._use.pop(sid, None)

    def admit_request(self, sid: str) -> None:
        """Count one request of ``sid`` against its rate limit (a sliding minute)."""
        use = self._use.setdefault(sid, _SessionUse())
        if not take_in_minute(use.requests, self._clock.monotonic(),
                              self._limits.requests_per_minute):  # fmt: skip
            wait = minute_wait(use.requests, self._clock.monotonic(),
                               self._limits.requests_per_minute)  # fmt: skip
            raise BudgetExceeded(
                f"egress: session {sid}: rate limit of {self._limits.requests_per_minute} "
                f"requests per minute reached; the next is taken in {wait:.1f} s",
                retry_after=wait,
            )

    @contextlib.asynccontextmanager
    async def slot(self, sid: str) -> AsyncIterator[None]:
        """One connection of ``sid`` in flight for the duration, within both connection caps."""
        use = self._use.setdefault(sid, _SessionUse())
        if use.connections >= self._limits.max_connections_per_session:
            raise BudgetExceeded(
                f"egress: session {sid}: {self._limits.max_connections_per_session} requests "
                "already in flight"
            )
        if self._connections >= self._limits.max_connections_total:
            raise BudgetExceeded("egress: the broker is at its connection cap; try again")
        use.connections += 1
        self._connections += 1
        try:
            yield
        finally:
            use.connections -= 1
            self._connections -= 1


def take_in_minute(times: collections.deque[float], now: float, per_minute: int) -> bool:
    """A sliding minute: forget the times older than a minute before ``now``; if fewer than
    ``per_minute`` are left, add ``now`` and say True, else False (nothing added)."""
    while times and times[0] <= now - 60:
        times.popleft()
    if len(times) >= per_minute:
        return False
    times.append(now)
    return True


def minute_wait(times: collections.deque[float], now: float, per_minute: int) -> float:
    """Seconds from ``now`` until :func:`take_in_minute` would take one more (0: it would now):
    when enough of the minute's times have aged out."""
    over = len(times) - per_minute
    return 0.0 if over < 0 else max(0.0, times[over] + 60 - now)
