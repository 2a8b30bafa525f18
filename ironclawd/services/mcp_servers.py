"""The real ``McpClients``: one live SDK ``ClientSession`` per (agent, server), supervised
(docs/mcp.md "Time-outs, caps and back-off").

Each server runs in a task of its own that holds the launcher's context (its unit) and the
session; callers only send requests over that session, each under a time-out, so a server that
hangs holds up its own callers for at most that long and nothing else. A server that fails (did
not start or initialize in time, crashed, hung past a time-out, sent a message over the cap) is
stopped, and the next use starts it again once an exponential back-off has passed; until then
callers get ``McpServerFailed`` at once, naming the failure. A successful answer resets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ironclawd.domain.mcp import McpLimits, McpServer, McpToolDef
from ironclawd.domain.message_ids import MessageId, message_id
from ironclawd.errors import InvalidArgument, McpServerFailed
from ironclawd.ports import Credentials
from ironclawd.services.mcp_calls import CALLER, PING_SECONDS, Caller, RunCalls

if TYPE_CHECKING:
    import mcp_types as types
    from mcp import ClientSession

# The SDK (~0.2-0.4 s of imports) is imported where a server is first spoken to, not when the
# daemon starts (issue 17).
from ironclawd.ports.mcp import McpCallResult, McpLauncher, McpTransport

log = logging.getLogger("ironclawd.mcp")

MAX_PAGES = 16  # tools/list pages read from one server
_Key = tuple[str, str]


@dataclass
class _Live:
    """One running server: the task that owns its unit and session."""

    server: McpServer
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    session: ClientSession | None = None
    transport: McpTransport | None = None
    task: asyncio.Task[None] | None = None
    error: str = ""
    deadline: float = 0.0  # the loop's time by which it must have initialized
    run: int = 0  # which start of a server this is (McpServerFailed.run)
    calls: RunCalls = field(default_factory=RunCalls)  # whose requests (services/mcp_calls.py)
    failing: str = ""  # why it is about to be stopped (a call timed out): no new caller gets it

    def why(self) -> str:
        told = self.transport.why() if self.transport is not None else ""
        return "; ".join(w for w in (self.error, told) if w) or "it stopped answering"


@dataclass
class _Backoff:
    failures: int = 0
    not_before: float = 0.0
    last: str = ""


class McpSupervisor:
    """``ports.McpClients`` over a ``McpLauncher`` and the official SDK's ``ClientSession``."""

    def __init__(
        self,
        launcher: McpLauncher,
        limits: McpLimits,
        monotonic: Callable[[], float] = time.monotonic,
        credentials: Credentials | None = None,
    ) -> None:
        self._launcher = launcher
        self._limits = limits
        self._credentials = credentials
        self._now = monotonic
        self._live: dict[_Key, _Live] = {}
        self._backoff: dict[_Key, _Backoff] = {}
        self._locks: dict[_Key, asyncio.Lock] = {}
        self._sweep: asyncio.Task[None] | None = None
        self._runs = itertools.count(1)
        # Whether close() has units to stop: every unit of this run was started by _start, and
        # a sweep that failed may have left an earlier run's.
        self._units_to_stop = True

    def sweep(self) -> None:
        """Stop the server units an earlier run left behind, in the background: the daemon's
        start does not wait for it (READY comes first, issue 17; listing units is a D-Bus call,
        and importing pystemd for it took ~10 ms of the start). Every server started from here
        on waits until the sweep is over, so it never stops one of this run's servers."""
        if self._sweep is None:
            self._sweep = asyncio.create_task(self._sweep_leftovers(), name="mcp sweep")

    async def _sweep_leftovers(self) -> None:
        try:
            await self._launcher.stop_all()
        except Exception as exc:  # a server that collides with a leftover then fails by name
            log.error("stopping the MCP server units an earlier run left behind: %s", exc)
        else:
            self._units_to_stop = False

    async def _swept(self) -> None:
        if self._sweep is not None:
            await asyncio.shield(self._sweep)  # a waiter cancelled does not cancel the sweep

    async def list_tools(self, agent: str, server: McpServer) -> tuple[McpToolDef, ...]:
        key = (agent, server.name)
        session = await self._session(key, server)
        out: list[McpToolDef] = []
        cursor: str | None = None
        import mcp_types as types  # noqa: PLC0415 (see the module's imports)

        from ironclawd.domain.kinds.mcp import tool_def  # noqa: PLC0415

        for _ in range(MAX_PAGES):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await self._request(
                key, session, "listing its tools", self._limits.list_timeout_seconds,
                session.list_tools(params=params),
            )  # fmt: skip
            try:
                out += [tool_def(t.name, t.description or "", t.input_schema) for t in page.tools]
            except InvalidArgument as exc:
                await self._fail(key, session, f"it offered a tool this ironclawd refuses: {exc}")
                raise McpServerFailed(f"MCP server {server.name}: {exc}") from None
            cursor = page.next_cursor
            if not cursor:
                break
        self._succeeded(key)
        return tuple(sorted(out, key=lambda t: t.name))

    async def call_tool(
        self, agent: str, server: McpServer, tool: str, arguments: dict[str, object]
    ) -> McpCallResult:
        if not isinstance(arguments, dict):
            raise InvalidArgument("MCP tool arguments: expected a JSON object")
        key = (agent, server.name)
        session = await self._session(key, server)
        try:
            result = await self._request(
                key, session, f"calling {tool}", self._limits.call_timeout_seconds,
                session.call_tool(tool, arguments), caller=Caller(),
            )  # fmt: skip
        except _Answered as exc:
            # The server is fine and said no (unknown tool, bad arguments): the caller's error.
            self._succeeded(key)
            return McpCallResult(text=f"MCP error from {server.name}: {exc}", is_error=True)
        self._succeeded(key)
        return self._cap(_text(result), result.is_error)

    def _cap(self, text: str, is_error: bool) -> McpCallResult:
        data = text.encode("utf-8")
        limit = self._limits.max_output_bytes
        if len(data) <= limit:
            return McpCallResult(text=text, is_error=is_error)
        cut = data[:limit].decode("utf-8", "ignore")
        return McpCallResult(text=cut, is_error=is_error, truncated=True)

    async def stop(self, agent: str, server: str) -> None:
        key = (agent, server)
        async with self._lock(key):
            await self._drop(key)
            self._backoff.pop(key, None)
        await self._launcher.stop(agent, server)

    async def close(self) -> None:
        await self._swept()
        for key in list(self._live):
            async with self._lock(key):
                await self._drop(key)
        if self._units_to_stop:  # (after a clean sweep and no server started: nothing is left)
            await self._launcher.stop_all()

    async def probe(self, agent: str, server: McpServer) -> tuple[McpToolDef, ...]:
        """Start ``server`` once for ``agent`` (its own unit, no network and no credentials:
        the command has not been approved, and the definitions go back to the caller), list its
        tools and stop it. Never touches the agent's live server of the same name."""
        # A remote server keeps its header credentials: the operator named both it and them, and
        # nothing runs host-side (its network is its URL, under the egress broker's rules).
        kept = server.credentials if server.url else ()
        bare = dataclasses.replace(server, credentials=kept, allow=(), tools=())
        key = (f"probe-{secrets.token_hex(4)}", server.name)
        try:
            tools = await self.list_tools(key[0], bare)
        finally:
            await self.stop(*key)
            self._locks.pop(key, None)
        self._refuse_echoed_credentials(server, tools)
        return tools

    def _refuse_echoed_credentials(self, server: McpServer, tools: Iterable[McpToolDef]) -> None:
        """A remote server was probed with its credential: definitions that carry it back would
        put it in the change's diff, so they are refused (the value as sent, not encodings)."""
        if not server.url or not server.credentials or self._credentials is None:
            return
        values = [self._credentials.get(name) for _, name in server.credentials]
        for tool in tools:
            text = f"{tool.name}\n{tool.description}\n{tool.input_schema}"
            if any(v and (v in text or json.dumps(v)[1:-1] in text) for v in values):
                raise McpServerFailed(
                    f"MCP server {server.name}: tool {tool.name}'s definition carries the "
                    "credential it was probed with; refused"
                )

    async def forget_unregistered(self, agent: str, servers: Iterable[McpServer]) -> None:
        """Stop the agent's servers that are no longer registered as they run (after a change
        is applied: an unregistered server's unit goes at once, a re-registered one restarts)."""
        current = {s.name: s for s in servers}
        for key, live in list(self._live.items()):
            if key[0] == agent and current.get(key[1]) != live.server:
                await self.stop(*key)

    def running(self) -> list[tuple[str, str]]:
        """(agent, server) of every server with a live session (status, tests)."""
        return sorted(k for k, v in self._live.items() if v.session is not None)

    # -- the session of one server --------------------------------------------------------------

    def _lock(self, key: _Key) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    async def _session(self, key: _Key, server: McpServer) -> ClientSession:
        async with self._lock(key):
            live = self._live.get(key)
            if live is not None and live.failing:  # a request timed out: it is being stopped
                raise McpServerFailed(f"MCP server {key[1]} of agent {key[0]} failed: "
                                      f"{live.failing}; it is being stopped")  # fmt: skip
            if live is not None and (live.server != server or _dead(live)):
                # Re-registered (another command or environment), or it went away.
                await self._drop(key)
                live = None
            if live is not None and live.session is not None:
                return live.session
            if live is None:
                live = await self._launch(key, server)
            # A start a cancelled caller left (the box hung up) is waited for, never begun again
            # beside it: a second server replaced the first in _live, and the first, once it
            # had initialized, ran on where nothing could stop it (found by a review).
            return await self._started(key, live)

    async def _launch(self, key: _Key, server: McpServer) -> _Live:
        agent, name = key
        backoff = self._backoff.get(key)
        if backoff is not None and self._now() < backoff.not_before:
            wait = backoff.not_before - self._now()
            raise McpServerFailed(
                f"MCP server {name} of agent {agent} failed {backoff.failures} time(s), last: "
                f"{backoff.last}; not restarted for another {wait:.1f}s"
            )
        await self._swept()
        self._units_to_stop = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._limits.connect_timeout_seconds
        live = _Live(server, deadline=deadline, run=next(self._runs))
        self._live[key] = live
        live.task = asyncio.create_task(self._run(agent, live), name=f"mcp {agent}/{name}")
        return live

    async def _started(self, key: _Key, live: _Live) -> ClientSession:
        """The session of ``live`` once it has initialized; McpServerFailed if it did not by
        its deadline (then it is dropped and its next start held off)."""
        agent, name = key
        timeout = self._limits.connect_timeout_seconds
        try:
            left = live.deadline - asyncio.get_running_loop().time()
            await asyncio.wait_for(live.ready.wait(), max(0.0, left))
        except TimeoutError:
            live.error = f"it did not start and initialize within {timeout:g}s"
        if live.session is None:
            why = live.why()
            self._hold_off(key, why)
            await self._drop(key)  # the lock is held here
            raise McpServerFailed(f"MCP server {name} of agent {agent} did not start: {why}")
        log.info("MCP server %s of agent %s started", name, agent)
        return live.session

    async def _run(self, agent: str, live: _Live) -> None:
        from mcp.shared.exceptions import MCPError  # noqa: PLC0415 (see the module's imports)

        try:
            async with self._launcher.open(agent, live.server) as transport:
                live.transport = transport
                writes = live.calls.writes(transport.write)
                async with _session_type()(transport.read, writes) as session:
                    await session.initialize()
                    live.session = session
                    live.ready.set()
                    await live.stopping.wait()
        except Exception as exc:  # a broken server must not take the daemon down
            leaf = _leaf(exc)
            if isinstance(leaf, McpServerFailed):
                live.error = str(leaf)
            elif isinstance(leaf, MCPError):
                live.error = f"initialize failed: {leaf}"
            else:
                live.error = f"{type(leaf).__name__}: {leaf}"
            log.warning("MCP server %s of agent %s: %s", live.server.name, agent, live.error)
        finally:
            live.ready.set()

    async def _request(
        self, key: _Key, session: ClientSession, what: str, seconds: float, request: Any, *,
        caller: Caller | None = None,
    ) -> Any:  # fmt: skip
        """``request`` under a time-out; ``caller``: the tool call it is (None: a listing)."""
        import mcp_types as types  # noqa: PLC0415 (see the module's imports)
        from mcp.shared.exceptions import MCPError  # noqa: PLC0415

        ran = self._live.get(key)
        ran = ran if ran is not None and ran.session is session else None
        timed_out = stopped = False
        noted = CALLER.set(caller)  # the request the SDK writes is noted as the caller's
        try:
            return await asyncio.wait_for(request, seconds)
        except TimeoutError:
            why, timed_out = f"it did not answer {what} within {seconds:g}s", True
            if ran is not None:
                ran.failing = ran.failing or why  # no new caller gets it until it is stopped
        except MCPError as exc:
            live = self._live.get(key)
            if exc.code != types.CONNECTION_CLOSED and live is not None and not _dead(live):
                raise _Answered(str(exc)) from None
            why, stopped = (live.why() if live is not None else str(exc)), True
        finally:
            CALLER.reset(noted)
            if ran is not None and caller is not None and not (stopped or timed_out):
                ran.calls.done(caller)
        # In a task of its own: a caller cancelled meanwhile leaves no server half stopped.
        await asyncio.shield(self._fail(key, session, why, caller if timed_out else None))
        # The gateway counts the stop against the call's session (``run``) unless it is known
        # to be another call's doing (``bystander``).
        known = ran is not None and not timed_out and ran.calls.bystander(caller, ran.transport)
        raise McpServerFailed(f"MCP server {key[1]} of agent {key[0]} failed: {why}",
                              run=ran.run if ran is not None else 0, bystander=known)  # fmt: skip

    async def _fail(
        self, key: _Key, session: ClientSession, why: str, timed_out: Caller | None = None
    ) -> None:
        """Hold off the server's restart, then stop it, unless another caller already replaced
        it (the hold-off is set first, under no lock, so no caller starts it meanwhile).
        ``timed_out``: the call that ran past its time-out, the failure's cause if the server
        still answers a ping (services/mcp_calls.py), asked before the stop cuts the others."""
        live = self._live.get(key)
        if live is None or live.session is not session:
            return  # someone else saw it fail first and dealt with it
        if timed_out is not None:
            ping = min(self._limits.list_timeout_seconds, PING_SECONDS)
            await live.calls.timed_out(timed_out, session, ping)
            if self._live.get(key) is not live:
                return  # another caller stopped it meanwhile (one failure, one hold-off)
        self._hold_off(key, why)
        async with self._lock(key):
            if self._live.get(key) is live:
                await self._drop(key)

    def _hold_off(self, key: _Key, why: str) -> None:
        """Count a failure: the next start waits, doubling from backoff_initial_seconds."""
        backoff = self._backoff.setdefault(key, _Backoff())
        backoff.failures += 1
        delay = min(
            self._limits.backoff_initial_seconds * 2 ** min(backoff.failures - 1, 30),
            self._limits.backoff_max_seconds,
        )
        backoff.not_before, backoff.last = self._now() + delay, why
        log.warning(
            "MCP server %s of agent %s failed (%s); restart held off %.1fs",
            key[1],
            key[0],
            why,
            delay,
            extra=message_id(MessageId.MCP_SERVER_FAILED, IRONCLAW_AGENT=key[0]),
        )

    def _succeeded(self, key: _Key) -> None:
        self._backoff.pop(key, None)

    async def _drop(self, key: _Key) -> None:
        live = self._live.pop(key, None)
        if live is None or live.task is None:
            return
        live.stopping.set()
        # The launcher's exit stops the unit (bounded); a task that still hangs is cancelled.
        done, _ = await asyncio.wait({live.task}, timeout=30.0)
        if not done:
            live.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await live.task


class _Answered(Exception):
    """The server answered the request with a JSON-RPC error (it is alive and well)."""


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups: what actually went wrong."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


@functools.cache
def _session_type() -> type[ClientSession]:
    """The SDK's client session without its check of a tool's result against the output schema
    the server lists. That check ran jsonschema (and Python's ``re``) on the event loop, with a
    schema the server chose at any time after approval: ``"^(a+)+$"`` and a 40-character answer
    held every session's loop for ever, past every time-out (found by a review). A result is
    untrusted text to the daemon either way: capped, masked and handed to the box as it is."""
    from mcp import ClientSession  # noqa: PLC0415 (see the module's imports)

    class UncheckedResults(ClientSession):
        async def validate_tool_result(self, name: str, result: types.CallToolResult) -> None:
            return None

    return UncheckedResults


def _dead(live: _Live) -> bool:
    ended = live.transport is not None and live.transport.ended()
    return ended or live.task is None or live.task.done()


def _text(result: types.CallToolResult) -> str:
    import mcp_types as types  # noqa: PLC0415 (see the module's imports)

    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        else:
            parts.append(f"[{block.type} content omitted]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)
