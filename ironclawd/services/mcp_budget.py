"""Each session's bounds on its MCP calls (docs/mcp.md "Time-outs, caps and back-off"), so that
one session of an agent cannot take its agent's servers from the others, nor flood the audit
log through them.

An agent's MCP server is one per (agent, server), shared by all the agent's sessions, and a
call the server cannot finish (it runs past ``call_timeout_seconds``, answers over
``max_message_bytes``, crashes) stops it for all of them, its restart held off 1-60 s: one
session could do it again and again (found by a review). So each stop counts against the session
whose call caused it where that is known, else against every session that had a call in flight
on that run of the server when it failed (services/mcp_calls.py says which is known: counting
every session in flight let a session's own time-outs take MCP from a bystander, found by a
review), and a session with ``stops_per_session`` such stops within ``stops_window_seconds`` is
refused MCP calls until the oldest of them is that old. Its calls only: the agent's other
sessions call on.

And every call counts against the session's ``calls_per_minute`` (a sliding minute), one refused
by a later check too, as egress requests do: each call costs the shared server a listing and a
call, and an audit record. One refused for this rate is not counted: a session calling faster
still gets its rate, and one that slows down is let in as the minute slides. Refusals for either
bound are audited as other refusals, at most 20 a minute per session, the next record counting
those left out.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from ironclawd.domain.mcp import McpLimits
from ironclawd.errors import BudgetExceeded
from ironclawd.ports import Clock
from ironclawd.services.egress_budget import minute_wait, take_in_minute


@dataclass
class _Use:
    calls: collections.deque[float] = field(default_factory=collections.deque)
    # (agent, server, run) -> when that run of the server failed with a call of the session's
    # in flight (not known to be another call's doing): one entry per stop, however many of its
    # calls were in flight.
    stops: dict[tuple[str, str, int], float] = field(default_factory=dict)


class McpBudget:
    """What each session has used of ``limits``' per-session bounds."""

    def __init__(self, limits: McpLimits, clock: Clock) -> None:
        self._limits = limits
        self._clock = clock
        self._use: dict[str, _Use] = {}

    def forget(self, sid: str) -> None:
        self._use.pop(sid, None)

    def check_stops(self, sid: str) -> None:
        """BudgetExceeded (saying for how long) while ``sid`` is refused for the stops."""
        use = self._use.setdefault(sid, _Use())
        now = self._clock.monotonic()
        window = self._limits.stops_window_seconds
        for key in [k for k, at in use.stops.items() if at <= now - window]:
            del use.stops[key]
        if len(use.stops) >= self._limits.stops_per_session:
            wait = min(use.stops.values()) + window - now
            raise BudgetExceeded(
                f"MCP: session {sid}: {len(use.stops)} of its agent's MCP server runs failed "
                f"with a call of this session in flight, of its doing or of no known cause, in "
                f"the last {window:g} s (each stopped the server for every session of the "
                f"agent); its MCP calls are refused for another {wait:.0f} s"
            )

    def count_call(self, sid: str) -> None:
        """Count one call of ``sid``, or raise BudgetExceeded without counting it if it is over
        its rate."""
        use = self._use.setdefault(sid, _Use())
        now, rate = self._clock.monotonic(), self._limits.calls_per_minute
        if not take_in_minute(use.calls, now, rate):
            wait = minute_wait(use.calls, now, rate)  # the agent waits it out (api/status.py)
            raise BudgetExceeded(
                f"MCP: session {sid}: rate limit of {rate} calls per minute reached; the next "
                f"is taken in {wait:.1f} s",
                retry_after=wait,
            )

    def stopped(self, sid: str, agent: str, server: str, run: int) -> None:
        """A call of ``sid`` was in flight on ``run`` of ``agent``'s ``server`` when it failed
        and was stopped, and the failure is not known to be another call's doing."""
        use = self._use.setdefault(sid, _Use())
        use.stops.setdefault((agent, server, run), self._clock.monotonic())
