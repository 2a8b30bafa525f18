"""The MCP supervisor and transport against a server that misbehaves on purpose (found by a
review): each through the real transport, supervisor and SDK session, over a scripted process
(tests/fakes/mcp_process.py), no subprocess."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.kinds.mcp import tool_def
from ironclawd.domain.mcp import McpGrant, McpLimits, McpServer
from ironclawd.services.mcp_gateway import McpGateway, McpGatewayLimits
from ironclawd.services.mcp_servers import McpSupervisor
from tests.fakes import FakeClock, FakeCredentials, RecordingAudit, StaticSessions
from tests.fakes.mcp import LocalLauncher
from tests.fakes.mcp_process import answering, initialized, install, line

INPUT = {"type": "object", "properties": {"q": {"type": "string"}}}
APPROVED = tool_def("lookup", "Look a word up.", INPUT)
# Catastrophic backtracking in Python's re: each extra "a" doubles the time (25: ~1.5 s).
EVIL_OUTPUT = {"type": "object", "properties": {"v": {"type": "string", "pattern": "^(a+)+$"}}}


def test_a_tools_output_schema_cannot_hold_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK checked a result against the output schema the server lists (which it may add
    after approval: the pin does not cover it) with jsonschema on the event loop: one answer
    held every session's loop for seconds, past every time-out."""

    def tools() -> list[dict[str, Any]]:
        return [{"name": "lookup", "description": "Look a word up.", "inputSchema": INPUT,
                 "outputSchema": EVIL_OUTPUT}]  # fmt: skip

    def call(params: dict[str, Any]) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": "ok"}],
                "structuredContent": {"v": "a" * 25 + "!"}}  # fmt: skip

    install(monkeypatch, answering(tools, call))
    server = McpServer("words", command=("/srv/words",), tools=(APPROVED,))
    grant = McpGrant("words", "lookup", APPROVED.digest)
    agents = {"a": AgentSpec("a", mcp_servers=(server,), mcp_grants=(grant,))}

    async def go() -> tuple[str, float]:
        clients = McpSupervisor(LocalLauncher(), McpLimits(connect_timeout_seconds=10))
        gateway = McpGateway(
            sessions=StaticSessions(sess0001="a"), agents=agents, clients=clients,
            credentials=FakeCredentials(), audit=RecordingAudit(), clock=FakeClock(),
            limits=McpGatewayLimits(call_timeout_seconds=10),
        )  # fmt: skip
        await clients.list_tools("a", server)  # the SDK imported outside the measurement
        gaps: list[float] = []

        async def heartbeat() -> None:  # every other session and service on the loop
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        beat = asyncio.create_task(heartbeat())
        await asyncio.sleep(0.05)
        result = await gateway.call("sess0001", "mcp__words__lookup", '{"q": "x"}')
        await asyncio.sleep(0.05)
        beat.cancel()
        await clients.close()
        return result.text, max(gaps)

    text, worst_gap = asyncio.run(go())
    assert text == "ok"  # the result as the server gave it: untrusted text, not checked
    assert worst_gap < 0.5, f"the event loop was held {worst_gap:.2f} s by one result"


def test_a_caller_cancelled_while_its_server_starts_leaves_one_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A box that hung up while its server was starting left a half-started server; the next
    call started a second beside it, and the first, once initialized, ran on where no stop,
    unregistration or close could reach it."""
    held: list[Any] = []  # (process, initialize answer), sent when the test says
    asked = asyncio.Event()
    started: list[Any] = []  # the processes, once installed

    def slow(req: dict[str, Any]) -> list[bytes]:
        method, rid = req.get("method"), req.get("id")
        if rid is None:
            return []
        if method == "initialize":
            held.append((started[-1], initialized(rid)))
            asked.set()
            return []
        return [line({"jsonrpc": "2.0", "id": rid, "result": {"tools": [
            {"name": "t", "description": "d", "inputSchema": {"type": "object"}}]}})]  # fmt: skip

    procs = install(monkeypatch, slow)
    started = procs  # the handler looks at the newest process
    server = McpServer("slow", command=("/srv/slow",))

    async def go() -> tuple[int, list[bool], bool]:
        launcher = LocalLauncher()
        clients = McpSupervisor(launcher, McpLimits(connect_timeout_seconds=10))
        first = asyncio.create_task(clients.list_tools("a", server))
        await asyncio.wait_for(asked.wait(), 10)
        first.cancel()  # the box hung up while its server was starting
        with pytest.raises(asyncio.CancelledError):
            await first
        second = asyncio.create_task(clients.list_tools("a", server))
        await asyncio.sleep(0.1)
        for proc, answer in held:
            await proc.out_send.send(answer + b"\n")
        await asyncio.wait_for(second, 10)
        tasks = [t for t in asyncio.all_tasks() if t.get_name() == "mcp a/slow"]
        await clients.close()
        await asyncio.sleep(0.1)
        still = [t for t in tasks if not t.done()]
        for t in still:
            t.cancel()
        return launcher.starts[("a", "slow")], [p.killed for p in procs], bool(still)

    starts, killed, leaked = asyncio.run(go())
    assert starts == 1
    assert all(killed)
    assert not leaked


def test_a_server_writing_lines_that_are_not_messages_is_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each non-message line on stdout cost a parse and a task in the SDK, without limit: a
    server writing them for ever held a daemon core and counted as healthy."""
    procs = install(monkeypatch, answering(lambda: [], lambda params: {}))
    server = McpServer("junk", command=("/srv/junk",))

    async def go() -> tuple[int, list[bool]]:
        launcher = LocalLauncher()
        clients = McpSupervisor(launcher, McpLimits(connect_timeout_seconds=10))
        await clients.list_tools("a", server)
        await procs[0].out_send.send(b"not a message\n" * 1000)
        await asyncio.sleep(0.3)
        await clients.list_tools("a", server)  # the first counts as gone: a new one starts
        killed = [p.killed for p in procs]
        await clients.close()
        return launcher.starts[("a", "junk")], killed

    starts, killed = asyncio.run(go())
    assert starts == 2
    assert killed == [True, False]
