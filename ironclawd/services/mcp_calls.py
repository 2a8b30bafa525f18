"""Whose call a failure of a shared MCP server was, for the supervisor (services/mcp_servers.py)
and, through ``McpServerFailed.bystander``, each session's count of stops (services/mcp_budget.py).

A server of an agent is shared by all its sessions, and a failure stops it for every call in
flight. Counting each stop against every session in flight let a session whose calls kept timing
out or answering over the cap take MCP from a bystander session of the same agent (found by a
review). So a run of a server notes which call each request it sent belongs to, and its failure
is pinned on one call where that is known: a call that ran past its time-out, or the call whose
answer the transport cut at ``max_message_bytes`` and could name (``McpTransport.over_cap``).
The other calls cut by that stop are bystanders: their sessions do not count it. Where nothing
names a call (the server closed its output or crashed, a listing timed out, an answer whose id
came after the cap) every call cut counts it, as before.

A time-out alone does not say whose doing it was: a call that stalls the whole server (a tool
that blocks its event loop) makes an older call in flight time out first. So a call that timed
out is the cause only if the server still answers a ping (``PING_SECONDS``): then that call is
stuck, not the server. A server that does not answer is stalled by whichever call, and every
call cut counts the stop.
"""

from __future__ import annotations

import asyncio
import contextvars
from types import TracebackType
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp.client._transport import WriteStream
    from mcp.shared.message import SessionMessage

    from ironclawd.ports.mcp import McpTransport

PING_SECONDS = 5.0  # how long a server that timed out a call has to answer a ping (at most)


class Caller:
    """One tool call on a server's session: the ids of the requests it sent (as text)."""

    __slots__ = ("ids",)

    def __init__(self) -> None:
        self.ids: list[str] = []


# The tool call whose task is sending (None: a listing or the SDK's own request). A task the
# call starts inherits it, so the request the SDK writes for it is noted as its.
CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("mcp_caller", default=None)


class RunCalls:
    """The tool calls of one run of a server, and the one its failure is pinned on."""

    def __init__(self) -> None:
        self.by_id: dict[str, Caller] = {}
        self.culprit: Caller | None = None

    def writes(self, inner: WriteStream[SessionMessage]) -> WriteStream[SessionMessage]:
        """``inner`` (the session's write stream), noting each request a call sends."""
        return _Noting(inner, self)

    def done(self, caller: Caller) -> None:
        """``caller`` finished without stopping the server: its requests are forgotten."""
        for rid in caller.ids:
            self.by_id.pop(rid, None)

    async def timed_out(self, caller: Caller, session: ClientSession, ping: float) -> None:
        """``caller`` ran past its time-out: the stop that follows is its doing if the server
        answers a ping within ``ping`` seconds."""
        if await answers_ping(session, ping) and self.culprit is None:
            self.culprit = caller

    def bystander(self, caller: Caller | None, transport: McpTransport | None) -> bool:
        """Whether the failure that cut ``caller`` is pinned on another call (one that timed
        out, or the one whose answer ``transport`` cut at the cap)."""
        over_cap = transport.over_cap() if transport is not None else None
        if self.culprit is None and over_cap is not None:
            self.culprit = self.by_id.get(over_cap)
        return self.culprit is not None and self.culprit is not caller


async def answers_ping(session: ClientSession, seconds: float) -> bool:
    """Whether the server answers a ping within ``seconds`` (a JSON-RPC error is an answer)."""
    import mcp_types as types  # noqa: PLC0415 (the SDK is imported where a server is used)
    from mcp.shared.exceptions import MCPError  # noqa: PLC0415

    try:
        await asyncio.wait_for(session.send_ping(), seconds)
    except MCPError as exc:
        return exc.code != types.CONNECTION_CLOSED
    except Exception:  # timed out, or an answer the SDK could not read
        return False
    return True


class _Noting:
    """A write stream that notes, for each request a call sends, that it is that call's."""

    def __init__(self, inner: WriteStream[SessionMessage], calls: RunCalls) -> None:
        self._inner = inner
        self._calls = calls

    async def send(self, item: SessionMessage, /) -> None:
        caller = CALLER.get()
        if caller is not None:
            message = item.message
            rid = getattr(message, "id", None)
            if getattr(message, "method", None) is not None and isinstance(rid, int | str):
                caller.ids.append(str(rid))
                self._calls.by_id[str(rid)] = caller
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        return await self._inner.__aexit__(exc_type, exc_val, exc_tb)
