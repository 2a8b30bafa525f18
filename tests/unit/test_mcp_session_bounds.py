"""Each session's bounds on its MCP calls (services/mcp_budget.py, ``[mcp] calls_per_minute``,
``stops_per_session``, ``stops_window_seconds``). An agent's MCP server is shared by all its
sessions, and a call that runs past ``call_timeout_seconds`` or answers over
``max_message_bytes`` stops it for every one of them, its restart held off: one session could do
it again and again, and its calls (each a listing, a call and an audit record) had no rate of
their own below the socket's 50 a second (found by a review).

The stops through the real supervisor, transport and SDK session over a scripted server
(tests/fakes/mcp_process.py, no subprocess); the rate and the audit over a scripted McpClients."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.kinds.mcp import tool_def
from ironclawd.domain.mcp import McpGrant, McpLimits, McpServer
from ironclawd.errors import BudgetExceeded, IronclawError, McpServerFailed, PolicyDenied
from ironclawd.services.mcp_budget import McpBudget
from ironclawd.services.mcp_gateway import McpGateway
from ironclawd.services.mcp_servers import McpSupervisor
from tests.fakes import FakeClock, FakeCredentials, RecordingAudit, StaticSessions
from tests.fakes.mcp import LocalLauncher
from tests.fakes.mcp_process import initialized, install, line
from tests.unit.test_mcp_gateway import NAME, World

INPUT = {"type": "object", "properties": {"q": {"type": "string"}}}
LOOKUP = tool_def("lookup", "Look a word up.", INPUT)
WORDS = McpServer("words", command=("/srv/words",), tools=(LOOKUP,))
AGENTS = {"a": AgentSpec("a", mcp_servers=(WORDS,),
                         mcp_grants=(McpGrant("words", "lookup", LOOKUP.digest),))}  # fmt: skip
CAP = 64 * 1024
LIMITS = McpLimits(connect_timeout_seconds=10, list_timeout_seconds=5, call_timeout_seconds=0.3,
                   max_message_bytes=CAP, backoff_initial_seconds=0.05,
                   backoff_max_seconds=0.05)  # fmt: skip
BOX, OTHER = "sess0001", "sess0002"  # two sessions of agent a
CALL = "mcp__words__lookup"


STARTED: list[Any] = []  # the scripted processes, newest last


def _words(req: dict[str, Any]) -> list[bytes]:
    """A server whose lookup of "big" answers over the cap (in pieces, as a pipe hands it
    over), of "hang" never, of anything else at once."""
    method, rid = req.get("method"), req.get("id")
    if rid is None:
        return []
    if method == "initialize":
        return [initialized(rid)]
    if method == "ping":  # (after a time-out: a server that answers is up, the call stuck)
        return [line({"jsonrpc": "2.0", "id": rid, "result": {}})]
    if method == "tools/list":
        tools = [{"name": "lookup", "description": "Look a word up.", "inputSchema": INPUT}]
        return [line({"jsonrpc": "2.0", "id": rid, "result": {"tools": tools}})]
    q = req["params"]["arguments"]["q"]
    if q == "big":
        answer = line({"jsonrpc": "2.0", "id": rid, "result": {"content": [
            {"type": "text", "text": "x" * 2 * CAP}]}})  # fmt: skip
        for at in range(0, len(answer), CAP // 2):
            STARTED[-1].out_send.send_nowait(answer[at : at + CAP // 2])
        return []
    if q == "hang":
        return []
    text = f"the meaning of {q}"
    return [line({"jsonrpc": "2.0", "id": rid,
                  "result": {"content": [{"type": "text", "text": text}]}})]  # fmt: skip


async def _outcome(gateway: McpGateway, sid: str, q: str) -> str:
    try:
        await gateway.call(sid, CALL, f'{{"q": "{q}"}}')
    except BudgetExceeded:
        return "refused"
    except McpServerFailed:
        return "failed"
    return "ok"


@pytest.mark.parametrize("q", ["big", "hang"])
def test_a_session_whose_calls_keep_stopping_its_agents_server_is_refused_and_others_call_on(
    monkeypatch: pytest.MonkeyPatch, q: str
) -> None:
    started = install(monkeypatch, _words)
    monkeypatch.setattr(f"{__name__}.STARTED", started)

    async def go() -> tuple[list[str], list[str]]:
        clients = McpSupervisor(LocalLauncher(max_message_bytes=CAP), LIMITS)
        gateway = McpGateway(
            sessions=StaticSessions(**{BOX: "a", OTHER: "a"}), agents=AGENTS, clients=clients,
            credentials=FakeCredentials(), audit=RecordingAudit(), clock=FakeClock(),
            session_limits=LIMITS,
        )  # fmt: skip
        box, other = [], []
        try:
            for _ in range(5):
                await asyncio.sleep(0.1)  # past the restart's hold-off
                box.append(await _outcome(gateway, BOX, q))
                other.append(await _outcome(gateway, OTHER, "word"))  # at once
        finally:
            await clients.close()
        return box, other

    box, other = asyncio.run(asyncio.wait_for(go(), 30))
    # Each of the box's first three calls stopped the agent's server, and the other session's
    # call right after found its restart held off; from then on the box's calls are refused
    # before they reach the server (they stopped it every time: 5 stops, 5 held off).
    assert box == ["failed"] * 3 + ["refused"] * 2
    assert other == ["failed"] * 3 + ["ok"] * 2
    assert len(started) == 4  # three stops, then one start that stays up


def test_a_session_is_refused_past_its_calls_a_minute_and_the_audit_keeps_count() -> None:
    world = World()
    clock = FakeClock()
    world.gateway = McpGateway(
        sessions=StaticSessions(sess0001="a", sess0003="a"), agents=world.agents,
        clients=world.mcp, credentials=FakeCredentials(), audit=world.audit, clock=clock,
        session_limits=McpLimits(calls_per_minute=10),
    )  # fmt: skip
    outcomes = []
    for _ in range(40):
        try:
            asyncio.run(world.gateway.call("sess0001", NAME, "{}"))
            outcomes.append("ok")
        except BudgetExceeded as exc:
            outcomes.append(f"{exc} (retry after {exc.retry_after})")
    # The fake clock stands still: all ten age out a minute on, and the agent waits that out.
    refusal = (
        "MCP: session sess0001: rate limit of 10 calls per minute reached; the next is taken in "
        "60.0 s (retry after 60.0)"
    )
    assert outcomes == ["ok"] * 10 + [refusal] * 30  # was 40 calls, 40 records
    assert len(world.mcp.called) == 10
    records = world.records()
    assert [r["outcome"] for r in records] == ["ok"] * 10 + ["over-rate"] * 20
    asyncio.run(world.gateway.call("sess0003", NAME, "{}"))  # another session: its own rate
    clock.advance(60)
    asyncio.run(world.gateway.call("sess0001", NAME, "{}"))
    # The 10 refusals left out of the audit are counted: here by the session's removal.
    world.gateway.forget("sess0001")
    assert world.records()[-1] == {"outcome": "unrecorded", "unrecorded_before": 10}


def test_refused_calls_count_against_the_rate_too() -> None:
    world = World()
    world.gateway = McpGateway(
        sessions=StaticSessions(sess0001="a"), agents=world.agents, clients=world.mcp,
        credentials=FakeCredentials(), audit=world.audit, clock=FakeClock(),
        session_limits=McpLimits(calls_per_minute=5),
    )  # fmt: skip
    for _ in range(5):
        with contextlib.suppress(PolicyDenied):
            asyncio.run(world.gateway.call("sess0001", "mcp__time__convert_time", "{}"))
    with pytest.raises(BudgetExceeded):
        asyncio.run(world.gateway.call("sess0001", NAME, "{}"))
    assert world.mcp.called == []


def test_a_call_refused_for_the_rate_is_not_counted_so_a_looping_session_gets_the_rate() -> None:
    """Calls refused by a later check count (above); one refused for this rate does not. A
    session looping at a call a second past a burst still gets 10 calls in every minute, and is
    let in again as soon as its oldest counted call is a minute old. (Counted, its refusals kept
    the minute full, and it was refused for as long as it called at least 10 a minute.)"""
    world = World()
    clock = FakeClock()
    world.gateway = McpGateway(
        sessions=StaticSessions(sess0001="a"), agents=world.agents, clients=world.mcp,
        credentials=FakeCredentials(), audit=world.audit, clock=clock,
        session_limits=McpLimits(calls_per_minute=10),
    )  # fmt: skip

    def call() -> bool:
        try:
            asyncio.run(world.gateway.call("sess0001", NAME, "{}"))
        except BudgetExceeded:
            return False
        return True

    assert [call() for _ in range(10)] == [True] * 10  # a burst at 0 s
    let_in = []
    for second in range(1, 180):
        clock.advance(1)
        if call():
            let_in.append(second)
    assert let_in == [*range(60, 70), *range(120, 130)]
    assert len(world.mcp.called) == 30


def test_a_stop_counts_once_for_each_session_with_a_call_in_flight_however_many() -> None:
    clock = FakeClock()
    budget = McpBudget(McpLimits(stops_per_session=2, stops_window_seconds=100), clock)
    for _ in range(3):  # three calls in flight on one run that failed: one stop
        budget.stopped(BOX, "a", "words", 7)
    budget.check_stops(BOX)
    budget.stopped(BOX, "a", "words", 8)
    with pytest.raises(BudgetExceeded, match="refused for another 100 s"):
        budget.check_stops(BOX)
    budget.check_stops(OTHER)  # its own count
    clock.advance(100)
    budget.check_stops(BOX)  # the oldest aged out of the window
    budget.forget(BOX)


def test_a_listing_that_fails_does_not_count_as_the_sessions_call_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway lists the server's tools before each call (the pin check): a listing is the
    host's own request, not the box's, so its failure is not held against the session."""

    async def go() -> list[str]:
        clients = McpSupervisor(LocalLauncher(max_message_bytes=CAP), LIMITS)
        gateway = McpGateway(
            sessions=StaticSessions(**{BOX: "a"}), agents=AGENTS, clients=clients,
            credentials=FakeCredentials(), audit=RecordingAudit(), clock=FakeClock(),
            session_limits=McpLimits(stops_per_session=1),
        )  # fmt: skip
        real = clients.list_tools

        async def broken(agent: str, server: McpServer) -> Any:
            raise McpServerFailed("MCP server words failed: it did not answer", run=1)

        outcomes = []
        try:
            clients.list_tools = broken  # type: ignore[method-assign]
            outcomes.append(await _outcome(gateway, BOX, "word"))
            clients.list_tools = real  # type: ignore[method-assign]
            outcomes.append(await _outcome(gateway, BOX, "word"))
        finally:
            await clients.close()
        return outcomes

    install(monkeypatch, _words)
    assert asyncio.run(asyncio.wait_for(go(), 30)) == ["failed", "ok"]


def test_an_error_keeps_the_run_it_names_through_the_gateways_masking() -> None:
    world = World()
    world.mcp.error = McpServerFailed("MCP server time of agent a failed: it crashed", run=4)
    with pytest.raises(McpServerFailed) as caught:
        world.call()
    assert caught.value.run == 4
    assert world.records()[-1]["outcome"] == "server-stopped"
    with contextlib.suppress(IronclawError):
        world.call()
    world.mcp.error = None
    assert world.call().text  # two stops of three: still let in
