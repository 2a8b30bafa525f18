"""ModelProxy's token budgets with fakes around it: a call holds a reservation from its admission
to its end, so calls running together cannot all pass the daily check before any is charged; a
call the agent abandons (or that runs out of time) is charged for what it may have cost; a call
without reported usage is charged an estimate; the audit record says what was charged; a
removed session's budget goes with it, and changed limits apply at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from dataclasses import replace

import httpx
import pytest

from ironclawd import ratelog
from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.model import Chunk, Completion, Message, ToolDef
from ironclawd.domain.tools import CATALOG
from ironclawd.errors import BudgetExceeded, ProviderError
from ironclawd.ports import Provider
from ironclawd.providers.anthropic import AnthropicProvider
from ironclawd.services.model_proxy import ModelProxy
from tests.fakes import FakeClock, FakeCredentials, RecordingAudit, StaticSessions
from tests.harness.fake_providers import Turn, anthropic_events, sse

SID = "sess0001"
HUGE = 10**9  # a limit a test does not exercise


@pytest.fixture(autouse=True)
def _own_log_throttle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refusals are logged at a bounded rate per session id, process-wide: these tests' must
    not use up the rate of other tests' sessions of the same id."""
    monkeypatch.setattr(ratelog, "AGENT_LOG", ratelog.LogThrottle())


class _Scripted:
    """A provider that plays back chunks and records what it was asked."""

    name = "scripted"

    def __init__(self, chunks: list[Chunk]) -> None:
        self.chunks = chunks
        self.seen: list[Completion] = []

    async def stream(self, completion: Completion, key: str, base_url: str) -> AsyncIterator[Chunk]:
        self.seen.append(completion)
        for chunk in self.chunks:
            yield chunk


def _proxy(
    providers: dict[str, Provider],
    audit: RecordingAudit | None = None,
    agents: dict[str, AgentSpec] | None = None,
    *,
    session_tokens_per_day: int = HUGE,
) -> ModelProxy:
    spec = AgentSpec("a", provider=next(iter(providers)), base_url="http://upstream.test",
                     tools=("read_file",), requests_per_minute=HUGE, tokens_per_day=HUGE,
                     session_requests_per_minute=HUGE,
                     session_tokens_per_day=session_tokens_per_day)  # fmt: skip
    return ModelProxy(
        sessions=StaticSessions(sess0001="a", sess0002="a"),
        agents=agents if agents is not None else {"a": spec},
        providers=providers,
        credentials=FakeCredentials(),
        base_urls={},
        audit=audit or RecordingAudit(),
        clock=FakeClock(1000.0),
    )


def _anthropic(body: Callable[[], AsyncIterator[bytes]]) -> AnthropicProvider:
    """The real Anthropic adapter over a transport that streams ``body()``."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    return AnthropicProvider(httpx.AsyncClient(transport=httpx.MockTransport(handler)))


def _from(events: Iterator[bytes]) -> Callable[[], AsyncIterator[bytes]]:
    data = list(events)

    async def body() -> AsyncIterator[bytes]:
        for part in data:
            yield part

    return body


async def _drain(proxy: ModelProxy, sid: str = SID, text: str = "hi") -> list[Chunk]:
    return [c async for c in proxy.complete(sid, [Message("user", text)], [], 0)]


def _calls(audit: RecordingAudit) -> list[dict[str, object]]:
    """The records of the calls admitted (refusals are recorded apart, at a bounded rate)."""
    return [fields for event, _, fields in audit.soon if event == "model.call"]


def _refusals(audit: RecordingAudit) -> list[dict[str, object]]:
    return [
        f for e, _, f in audit.records if e == "model.call" and f["status"] == "budget-exceeded"
    ]


# -- calls in flight ---------------------------------------------------------------------------


def test_calls_in_flight_together_cannot_all_pass_the_daily_check() -> None:
    """Each call sends ~100,000 tokens: a budget of 200,000 admits two at once, not thirty."""
    text = "w" * 200_000  # two messages: 400,000 characters, ~100,000 tokens
    provider = _Scripted([Chunk(text="ok"), Chunk(usage=(100_000, 1_000))])
    proxy = _proxy({"scripted": provider}, session_tokens_per_day=200_000)
    messages = [Message("user", text), Message("user", text)]

    async def go() -> None:
        running, refused = [], []
        for _ in range(30):
            call = proxy.complete(SID, messages, [], 0)
            try:
                first = await anext(call)  # admitted, and now in flight
            except BudgetExceeded as exc:
                refused.append(str(exc))
                continue
            assert first.text == "ok"
            running.append(call)
        assert len(running) == 2
        assert len(refused) == 28
        assert all("reserved by calls in flight" in message for message in refused)
        for call in running:
            _ = [c async for c in call]
        with pytest.raises(BudgetExceeded, match=r"used up \(202000\)"):
            await _drain(proxy)

    asyncio.run(go())
    assert len(provider.seen) == 2


def test_a_call_that_ended_gives_its_reservation_back() -> None:
    provider = _Scripted([Chunk(text="ok"), Chunk(usage=(10, 10))])
    proxy = _proxy({"scripted": provider}, session_tokens_per_day=1100)  # max_tokens is 1024

    async def go() -> None:
        for _ in range(5):  # 20 tokens each; a reservation kept would refuse the second
            await _drain(proxy)

    asyncio.run(go())
    assert len(provider.seen) == 5


# -- what a call is charged --------------------------------------------------------------------


def test_a_call_abandoned_once_its_tool_call_arrived_is_charged_its_input_and_max_tokens() -> None:
    """The agent closes its stream as soon as it has the tool call, before the provider's final
    usage: the input was billed upstream all the same."""
    turn = Turn(tool=("toolu_1", "read_file", '{"path": "a"}'))
    audit = RecordingAudit()
    provider = _anthropic(_from(anthropic_events(turn, "m", input_tokens=150_000)))
    proxy = _proxy({"anthropic": provider}, audit, session_tokens_per_day=100_000)

    async def go() -> None:
        call = proxy.complete(SID, [Message("user", "x")], [CATALOG["read_file"]], 0)
        assert isinstance(call, AsyncGenerator)
        async for chunk in call:
            if chunk.tool_call is not None:
                break
        await call.aclose()  # what a cancelled gRPC stream does to the generator
        await asyncio.sleep(0)  # the record is written on the loop's next turn
        with pytest.raises(BudgetExceeded, match=r"session sess0001: daily .* \(151024\)"):
            await _drain(proxy)

    asyncio.run(go())
    (record,) = _calls(audit)
    assert record["status"] == "abandoned"
    assert (record["tokens_in"], record["tokens_out"]) == (150_000, 0)
    assert record["tokens_charged"] == 150_000 + 1024


def test_a_call_cancelled_while_the_model_writes_is_charged_its_input_and_max_tokens() -> None:
    """Cancelled as grpc cancels the handler when the box resets its stream or the call's
    time (max_call_seconds) is up, while the upstream is still writing."""
    writing = asyncio.Event()
    audit = RecordingAudit()

    async def body() -> AsyncIterator[bytes]:
        yield sse({"type": "message_start", "message": {"usage": {"input_tokens": 5_000}}})
        yield sse({"type": "content_block_delta",
                   "delta": {"type": "text_delta", "text": "thinking"}})  # fmt: skip
        await asyncio.Event().wait()  # never set: the model is still writing
        yield b""

    proxy = _proxy({"anthropic": _anthropic(body)}, audit)

    async def handler() -> None:
        async for chunk in proxy.complete(SID, [Message("user", "x")], [], 0):
            if chunk.text:
                writing.set()

    async def go() -> None:
        task = asyncio.ensure_future(handler())
        await writing.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)

    asyncio.run(go())
    (record,) = _calls(audit)
    assert record["status"] == "abandoned"
    assert record["tokens_in"] == 5_000
    assert record["tokens_charged"] == 5_000 + 1024


def test_an_upstream_error_after_message_start_is_charged_the_input_reported() -> None:
    audit = RecordingAudit()

    async def body() -> AsyncIterator[bytes]:
        yield sse({"type": "message_start", "message": {"usage": {"input_tokens": 600}}})
        yield sse({"type": "error", "error": {"type": "overloaded_error"}}, "error")

    proxy = _proxy({"anthropic": _anthropic(body)}, audit, session_tokens_per_day=1000)

    async def go() -> None:
        for _ in range(2):
            with pytest.raises(ProviderError, match="overloaded_error"):
                await _drain(proxy)
        with pytest.raises(BudgetExceeded, match=r"\(1200\)"):
            await _drain(proxy)

    asyncio.run(go())
    record = _calls(audit)[0]
    assert record["status"] == "upstream-error"
    assert (record["tokens_in"], record["tokens_out"], record["tokens_charged"]) == (600, 0, 600)


def test_a_provider_never_reached_is_charged_nothing_a_dropped_connection_its_ceiling() -> None:
    """No connection, no request sent: nothing can have been billed. A connection that drops
    once the request went may have been billed for a whole answer: charged as abandoned."""
    audit = RecordingAudit()
    failures = [httpx.ConnectError("refused"), httpx.PoolTimeout("no connection free"),
                httpx.UnsupportedProtocol("ftp://"), httpx.ReadError("reset")]  # fmt: skip

    def handler(request: httpx.Request) -> httpx.Response:
        raise failures.pop(0)

    provider = AnthropicProvider(httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    proxy = _proxy({"anthropic": provider}, audit)

    async def go() -> None:
        for _ in range(4):
            with pytest.raises(ProviderError):
                await _drain(proxy, text="u" * 40)

    asyncio.run(go())
    *never, dropped = _calls(audit)
    assert [(n["status"], n["tokens_charged"]) for n in never] == [("transport-error", 0)] * 3
    assert dropped["status"] == "transport-error"
    assert isinstance(dropped["tokens_charged"], int)
    assert dropped["tokens_charged"] > 1000  # the input estimate and the agent's max_tokens


def test_an_answer_without_usage_is_charged_its_estimate() -> None:
    """An OpenAI-compatible server may send no usage: the call is charged its input estimate
    (a quarter of the characters sent) and a quarter of the characters it answered."""
    audit = RecordingAudit()
    provider = _Scripted([Chunk(text="a" * 400), Chunk(stop_reason="end_turn")])
    proxy = _proxy({"scripted": provider}, audit, session_tokens_per_day=120)

    async def go() -> None:
        await _drain(proxy, text="u" * 40)
        with pytest.raises(BudgetExceeded):
            await _drain(proxy)

    asyncio.run(go())
    (completion,) = provider.seen
    sent = len(completion.system) + 40  # no tools offered
    (record,) = _calls(audit)
    assert (record["tokens_in"], record["tokens_out"]) == (0, 0)
    assert record["tokens_charged"] == -(-sent // 4) + 100  # the 400 characters answered


# -- sessions come and go; limits change -------------------------------------------------------


def test_a_removed_sessions_budget_and_refusal_count_go_with_it() -> None:
    audit = RecordingAudit()
    provider = _Scripted([Chunk(text="ok"), Chunk(usage=(60, 60))])
    proxy = _proxy({"scripted": provider}, audit, session_tokens_per_day=100)

    async def go() -> None:
        await _drain(proxy)
        for _ in range(25):  # 20 refusals a minute are recorded
            with pytest.raises(BudgetExceeded):
                await _drain(proxy)
        proxy.forget(SID)  # removed; a new session is made with the same id
        await _drain(proxy)
        for _ in range(2):
            with pytest.raises(BudgetExceeded):
                await _drain(proxy)

    asyncio.run(go())
    assert [r["status"] for r in _calls(audit)] == ["ok", "ok"]
    # 20 of the first 25 refusals, then both of the new session's: its count started afresh.
    refused = _refusals(audit)
    assert len(refused) == 22
    assert "unrecorded_before" not in refused[20]


def test_the_agents_limits_apply_as_soon_as_they_change() -> None:
    """An approved change (or a session re-made with the same id for another agent) must not
    run on the limits of the first call's agent; what was counted before still counts."""
    provider = _Scripted([Chunk(text="ok"), Chunk(usage=(1, 1))])
    agents: dict[str, AgentSpec] = {}
    proxy = _proxy({"scripted": provider}, agents=agents)
    agents["a"] = AgentSpec("a", provider="scripted", session_requests_per_minute=1000,
                            requests_per_minute=1000)  # fmt: skip

    async def go() -> None:
        await _drain(proxy)
        agents["a"] = replace(agents["a"], session_requests_per_minute=2)
        await _drain(proxy)  # the second request of the minute
        with pytest.raises(BudgetExceeded, match="session sess0001: rate limit of 2"):
            await _drain(proxy)
        agents["a"] = replace(agents["a"], session_requests_per_minute=1000, requests_per_minute=2)
        with pytest.raises(BudgetExceeded, match="agent a: rate limit of 2"):
            await _drain(proxy, sid="sess0002")

    asyncio.run(go())
    assert len(provider.seen) == 2


# -- the tools sent upstream -------------------------------------------------------------------


def test_a_tool_offered_many_times_goes_upstream_once() -> None:
    provider = _Scripted([Chunk(text="ok")])
    proxy = _proxy({"scripted": provider})
    offered = [ToolDef("read_file", "", "")] * 10_000

    async def go() -> None:
        _ = [c async for c in proxy.complete(SID, [Message("user", "hi")], offered, 0)]

    asyncio.run(go())
    assert provider.seen[0].tools == (CATALOG["read_file"],)
