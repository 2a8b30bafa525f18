"""Which session a stop of its agent's shared MCP server counts against (``[mcp]
stops_per_session``, services/mcp_budget.py). Every session with a call in flight when the
server failed was counted, the bystander too: a session whose calls kept timing out or
answering over the cap took MCP from the agent's other sessions for up to
``stops_window_seconds`` (found by a review). A stop whose cause is known (a call that ran past
its time-out, a call whose answer the transport cut at ``max_message_bytes`` and could name)
now counts against that call's session only; one whose cause is not known (the server closed
its output, a listing timed out behind a hung call, an answer over the cap whose id came after
its result) still counts against every session in flight.

Through the real supervisor, transport and SDK session over a scripted server
(tests/fakes/mcp_process.py, no subprocess)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from ironclawd.domain.egress import EgressLimits
from ironclawd.domain.mcp import McpServer
from ironclawd.errors import BudgetExceeded, McpServerFailed
from ironclawd.host.mcp import answer_id
from ironclawd.host.mcp_remote import RemoteMcpLauncher
from ironclawd.services.mcp_gateway import McpGateway
from ironclawd.services.mcp_servers import McpSupervisor
from tests.fakes import FakeClock, FakeCredentials, RecordingAudit, StaticSessions
from tests.fakes.mcp import LocalLauncher
from tests.fakes.mcp_process import ScriptedProcess, initialized, install, line
from tests.unit.test_mcp_remote import _Resolver
from tests.unit.test_mcp_session_bounds import AGENTS, BOX, CALL, CAP, INPUT, LIMITS, OTHER

STARTED: list[ScriptedProcess] = []  # the scripted processes, newest last
STUCK: set[int] = set()  # id() of the processes that answer nothing any more


def _server(req: dict[str, Any]) -> list[bytes]:
    """A lookup of "hang" is never answered, of "slow" not before the stop that cuts it, of
    "stall" never and nothing after it either (the server is stuck), of "big" over the cap with
    the id first (as the Python SDK writes it), of "big-id-last" over the cap with the id after
    the result (as the TypeScript SDK writes it), of "crash" by the server closing its output;
    anything else at once."""
    proc = STARTED[-1]
    method, rid = req.get("method"), req.get("id")
    if rid is None or id(proc) in STUCK:
        return []
    if method == "initialize":
        return [initialized(rid)]
    if method == "ping":
        return [line({"jsonrpc": "2.0", "id": rid, "result": {}})]
    if method == "tools/list":
        tools = [{"name": "lookup", "description": "Look a word up.", "inputSchema": INPUT}]
        return [line({"jsonrpc": "2.0", "id": rid, "result": {"tools": tools}})]
    q = req["params"]["arguments"]["q"]
    result = {"content": [{"type": "text", "text": "x" * 2 * CAP if "big" in q else q}]}
    if q == "stall":
        STUCK.add(id(proc))
    if q in ("hang", "slow", "stall"):
        return []
    if q == "crash":
        proc.out_send.close()
        return []
    if q == "big-id-last":
        answer = line({"result": result, "jsonrpc": "2.0", "id": rid})
    else:
        answer = line({"jsonrpc": "2.0", "id": rid, "result": result})
    if "big" not in q:
        return [answer]
    for at in range(0, len(answer), CAP // 2):  # in pieces, as a pipe hands it over
        proc.out_send.send_nowait(answer[at : at + CAP // 2])
    return []


async def _outcome(gateway: McpGateway, sid: str, q: str) -> str:
    try:
        await gateway.call(sid, CALL, f'{{"q": "{q}"}}')
    except BudgetExceeded:
        return "refused"
    except McpServerFailed:
        return "failed"
    return "ok"


def _rounds(
    monkeypatch: pytest.MonkeyPatch,
    first: tuple[str, str],
    second: tuple[str, str],
    limits: Any = LIMITS,
) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """Three rounds of ``first`` (session, q) then, 50 ms later, ``second`` while the first is
    in flight; then one plain call of each session: what each got."""
    monkeypatch.setattr(f"{__name__}.STARTED", install(monkeypatch, _server))

    async def go() -> tuple[list[tuple[str, str]], dict[str, str]]:
        clients = McpSupervisor(LocalLauncher(max_message_bytes=CAP), limits)
        gateway = McpGateway(
            sessions=StaticSessions(**{BOX: "a", OTHER: "a"}), agents=AGENTS, clients=clients,
            credentials=FakeCredentials(), audit=RecordingAudit(), clock=FakeClock(),
            session_limits=limits,
        )  # fmt: skip
        rounds = []
        try:
            await clients.list_tools("a", AGENTS["a"].mcp_servers[0])  # started: no race to it
            for _ in range(3):
                await asyncio.sleep(0.1)  # past the restart's hold-off
                one = asyncio.create_task(_outcome(gateway, *first))
                await asyncio.sleep(0.05)
                two = await _outcome(gateway, *second)
                rounds.append((await one, two))
            await asyncio.sleep(0.1)
            after = {sid: await _outcome(gateway, sid, "word") for sid in (BOX, OTHER)}
        finally:
            await clients.close()
        return rounds, after

    return asyncio.run(asyncio.wait_for(go(), 30))


@pytest.mark.parametrize(
    ("first", "second"),
    [((BOX, "hang"), (OTHER, "slow")), ((OTHER, "slow"), (BOX, "big"))],
    ids=["timed-out", "over-the-cap"],
)
def test_a_bystander_in_flight_when_another_sessions_call_stops_the_server_keeps_its_mcp(
    monkeypatch: pytest.MonkeyPatch, first: tuple[str, str], second: tuple[str, str]
) -> None:
    rounds, after = _rounds(monkeypatch, first, second)
    assert rounds == [("failed", "failed")] * 3  # each round, both calls cut by one stop
    # The box's three stops are its own; the other session was only in flight at them (it was
    # refused for 10 minutes after the third).
    assert after == {BOX: "refused", OTHER: "ok"}


@pytest.mark.parametrize("q", ["crash", "big-id-last"])
def test_a_stop_of_unknown_cause_counts_against_every_session_in_flight(
    monkeypatch: pytest.MonkeyPatch, q: str
) -> None:
    """The server closed its output, or sent a message over the cap whose id was past the cap:
    nothing says which call it was, so the rule stays that each session in flight counts it."""
    rounds, after = _rounds(monkeypatch, (OTHER, "slow"), (BOX, q))
    assert rounds == [("failed", "failed")] * 3
    assert after == {BOX: "refused", OTHER: "refused"}


def test_a_call_that_stalls_the_server_is_not_let_off_when_an_older_call_times_out_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call that blocks the whole server (the box's "stall") makes the call in flight before
    it (the other session's) time out first. The server then answers no ping either, so the
    time-out names no call: both sessions count the stop. (Pinned on the older call, the stop
    let the stalling session off and counted only against the other, round after round.)"""
    limits = dataclasses.replace(LIMITS, list_timeout_seconds=0.2)  # the ping's time too
    rounds, after = _rounds(monkeypatch, (OTHER, "slow"), (BOX, "stall"), limits)
    assert rounds == [("failed", "failed")] * 3
    assert after == {BOX: "refused", OTHER: "refused"}


def test_a_listing_that_times_out_behind_a_stalled_call_does_not_let_the_call_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call that stalls the whole server is cut when the next listing (the host's own request,
    with the shorter time-out) times out; that time-out names no call of a session, so the
    stalled call's session counts the stop, and the session whose listing it was does not."""
    limits = dataclasses.replace(LIMITS, list_timeout_seconds=0.2, call_timeout_seconds=1.0)
    rounds, after = _rounds(monkeypatch, (BOX, "stall"), (OTHER, "word"), limits)
    assert rounds == [("failed", "failed")] * 3
    assert after == {BOX: "refused", OTHER: "ok"}


@pytest.mark.parametrize(
    ("start", "found"),
    [
        (b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"xxx', "7"),
        (b'{"id": "call-7", "jsonrpc": "2.0", "error": {"code": -1, "message": "xx', "call-7"),
        (b' {"jsonrpc" : "2.0" , "id" : 12 , "result" : {', "12"),
        # The id after the result (the TypeScript SDK's order): past the cap, never read.
        (b'{"result":{"content":[{"type":"text","text":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx', None),
        # An id inside the result is not the answer's.
        (b'{"result":{"id":7,"content":[{"type":"text","text":"xxxxxxxxxxxxxxxxxxxxxxxxx', None),
        # The server's own request (its id is from its own count, not the daemon's).
        (b'{"jsonrpc":"2.0","id":7,"method":"sampling/createMessage","params":{"xxxxxxxx', None),
        (b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"xxxxxxxxx', None),
        (b'{"jsonrpc":"2.0","id":"a\\"b","result":{', None),  # an escape: not read, not guessed
    ],
)
def test_the_stdio_transport_names_an_answer_cut_at_the_cap_only_by_its_own_leading_id(
    start: bytes, found: str | None
) -> None:
    assert answer_id(start) == found


def test_a_remote_servers_answer_cut_at_the_cap_is_pinned_on_its_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A remote server's answer comes in the response to the call's own POST, so the transport
    knows whose answer it cut; the cut ends the whole client, and the call in flight beside it
    is a bystander of that stop."""

    class Upstream(httpx2.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            body = json.loads(request.content)
            rid, method = body.get("id"), body.get("method")
            if rid is None:
                return httpx2.Response(202)
            if method == "initialize":
                result: Any = json.loads(initialized(rid))["result"]
            elif method == "tools/list":
                result = {"tools": [{"name": "lookup", "inputSchema": INPUT}]}
            else:
                q = body["params"]["arguments"]["q"]
                if q == "slow":
                    await asyncio.sleep(5)
                text = "x" * 2 * CAP if q == "big" else q
                result = {"content": [{"type": "text", "text": text}]}
            data = line({"jsonrpc": "2.0", "id": rid, "result": result})
            return httpx2.Response(200, headers={"Content-Type": "application/json"},
                                   stream=_Chunks(data))  # fmt: skip

    monkeypatch.setattr(httpx2, "AsyncHTTPTransport", lambda **kw: Upstream())  # the network
    server = McpServer("words", url="https://mcp.example.com/mcp")

    async def call(clients: McpSupervisor, q: str) -> tuple[int, bool]:
        with pytest.raises(McpServerFailed) as failed:
            await clients.call_tool("a", server, "lookup", {"q": q})
        return failed.value.run, getattr(failed.value, "bystander", False)

    async def go() -> tuple[tuple[int, bool], tuple[int, bool]]:
        resolver = _Resolver("93.184.216.34")  # a public address: the broker's rules let it
        launcher = RemoteMcpLauncher(FakeCredentials(), LIMITS, EgressLimits(), resolver,
                                     lambda *a, **f: None, ssl.create_default_context)  # fmt: skip
        clients = McpSupervisor(launcher, LIMITS)
        try:
            await clients.list_tools("a", server)
            slow = asyncio.create_task(call(clients, "slow"))
            await asyncio.sleep(0.05)
            return await call(clients, "big"), await slow
        finally:
            await clients.close()

    big, slow = asyncio.run(asyncio.wait_for(go(), 30))
    assert big == (1, False)  # the stop counts against the session whose answer was cut
    assert slow == (1, True)  # and not against the one beside it


class _Chunks(httpx2.AsyncByteStream):
    """A body as the network hands it over: in pieces, read as they come."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for at in range(0, len(self._data), CAP // 4):
            yield self._data[at : at + CAP // 4]


def test_a_caller_cancelled_while_its_timed_out_server_is_pinged_leaves_it_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a call's time-out no new caller gets the server until the ping is over and it is
    stopped; a box that hangs up meanwhile must not leave it marked so, refusing every call."""
    monkeypatch.setattr(f"{__name__}.STARTED", install(monkeypatch, _server))
    limits = dataclasses.replace(LIMITS, list_timeout_seconds=0.5)  # the ping's time too
    server = AGENTS["a"].mcp_servers[0]

    async def go() -> tuple[str, str, str]:
        launcher = LocalLauncher(max_message_bytes=CAP)
        clients = McpSupervisor(launcher, limits)
        try:
            await clients.list_tools("a", server)  # started (and the SDK imported) first
            stalled = asyncio.create_task(clients.call_tool("a", server, "lookup", {"q": "stall"}))
            await asyncio.sleep(0.4)  # timed out at 0.3 s; the server answers no ping
            with pytest.raises(McpServerFailed) as meanwhile:
                await clients.call_tool("a", server, "lookup", {"q": "word"})
            stalled.cancel()
            await asyncio.sleep(0.5)  # the ping given up, the server stopped, the hold-off over
            after = await clients.call_tool("a", server, "lookup", {"q": "word"})
            return str(meanwhile.value), after.text, str(launcher.starts)
        finally:
            await clients.close()

    meanwhile, after, starts = asyncio.run(asyncio.wait_for(go(), 30))
    assert meanwhile.endswith("it did not answer calling lookup within 0.3s; it is being stopped")
    assert (after, starts) == ("word", "{('a', 'words'): 2}")
