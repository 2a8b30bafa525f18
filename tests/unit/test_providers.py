"""The Anthropic and OpenAI-compatible adapters against recorded-shape event streams, through
httpx.MockTransport (in-process: no socket). The streams are cut into odd byte chunks, so events
and lines arrive split the way a network delivers them. What the adapter sends is recorded and
checked too: the key in its header, the host's persona as the system prompt, only the tools given.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from ironclawd.domain.model import Chunk, Completion, Message, ToolCall, ToolDef
from ironclawd.domain.tools import CATALOG
from ironclawd.errors import ProviderError
from ironclawd.providers.anthropic import AnthropicProvider
from ironclawd.providers.mock import MockProvider
from ironclawd.providers.openai import OpenAIProvider
from tests.harness.fake_providers import Turn, anthropic_events, openai_events, sse

KEY = "sk-test-0123456789"
PERSONA = "You are the host's persona."


def _completion(*messages: Message, tools: tuple[ToolDef, ...] = ()) -> Completion:
    return Completion(PERSONA, messages, tools, "model-x", 512)


def _run(
    provider_cls: type[AnthropicProvider] | type[OpenAIProvider],
    events: Iterator[bytes] | bytes,
    completion: Completion,
    *,
    status: int = 200,
    cut: int = 7,
) -> tuple[list[Chunk], list[httpx.Request]]:
    seen: list[httpx.Request] = []
    data = events if isinstance(events, bytes) else b"".join(events)

    async def body() -> AsyncIterator[bytes]:
        for i in range(0, len(data), cut):
            yield data[i : i + cut]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, content=body(), headers={"content-type": "text/event-stream"})

    async def go() -> list[Chunk]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            provider = provider_cls(client)
            return [c async for c in provider.stream(completion, KEY, "http://upstream.test/v1")]

    return asyncio.run(go()), seen


def _text(chunks: list[Chunk]) -> str:
    return "".join(c.text for c in chunks)


USER = Message("user", "hi")
TOOLS = (CATALOG["read_file"], CATALOG["write_file"])


@pytest.mark.parametrize("cut", [1, 3, 7, 64, 100_000])
def test_anthropic_text_stream(cut: int) -> None:
    text = "Hello there, split across many events."
    chunks, seen = _run(
        AnthropicProvider, anthropic_events(Turn(text=text), "model-x"), _completion(USER), cut=cut
    )
    assert _text(chunks) == text
    assert len([c for c in chunks if c.text]) == len(range(0, len(text), 5))  # one per delta
    # The input as soon as message_start says it (a call abandoned after it is charged it).
    assert [c.usage for c in chunks if c.usage] == [(25, 0), (25, 8)]
    assert [c.stop_reason for c in chunks if c.stop_reason] == ["end_turn"]
    (request,) = seen
    assert str(request.url) == "http://upstream.test/v1/v1/messages"
    assert request.headers["x-api-key"] == KEY
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    body = json.loads(request.content)
    assert body["system"] == PERSONA
    assert body["stream"] is True
    assert body["model"] == "model-x"
    assert body["max_tokens"] == 512
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert "tools" not in body


def test_anthropic_tool_call_from_input_json_deltas() -> None:
    args = json.dumps({"path": "notes/a.txt", "content": "x" * 40})
    turn = Turn(tool=("toolu_01", "write_file", args))
    chunks, seen = _run(
        AnthropicProvider, anthropic_events(turn, "m"), _completion(USER, tools=TOOLS), cut=5
    )
    calls = [c.tool_call for c in chunks if c.tool_call]
    assert calls == [ToolCall("toolu_01", "write_file", args)]
    assert [c.stop_reason for c in chunks if c.stop_reason] == ["tool_use"]
    body = json.loads(seen[0].content)
    assert [t["name"] for t in body["tools"]] == ["read_file", "write_file"]
    assert body["tools"][1]["input_schema"] == json.loads(CATALOG["write_file"].parameters_json)


def test_anthropic_history_with_tool_use_and_result() -> None:
    call = ToolCall("toolu_9", "read_file", '{"path": "a"}')
    completion = _completion(
        USER, Message("assistant", "", (call,)), Message("tool", "contents", tool_call_id="toolu_9")
    )
    _, seen = _run(AnthropicProvider, anthropic_events(Turn(text="ok"), "m"), completion)
    messages = json.loads(seen[0].content)["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_9", "name": "read_file",
                     "input": {"path": "a"}}],
    }  # fmt: skip
    assert messages[2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "contents"}],
    }


def test_anthropic_error_event_and_http_error() -> None:
    stream = b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error"}}\n\n'
    with pytest.raises(ProviderError, match="overloaded_error"):
        _run(AnthropicProvider, stream, _completion(USER))
    body = json.dumps({"error": {"message": f"bad key {KEY}"}}).encode()
    with pytest.raises(ProviderError, match=r"HTTP 401: .*bad key") as info:
        _run(AnthropicProvider, body, _completion(USER), status=401)
    # The adapter keeps the body whole: redaction and clipping are the proxy's (a cut here
    # could leave a prefix of the key that no longer matches it).
    assert KEY in str(info.value)


@pytest.mark.parametrize("status", [200, 500])
def test_an_answer_in_another_coding_than_identity_is_refused_unread(status: int) -> None:
    """httpx unpacked each gzip chunk from the network whole before any cap here: a 260 KB
    error body became a 64 MiB message (found by a review). The adapters ask for identity and
    refuse anything else."""
    seen: list[httpx.Request] = []
    packed = gzip.compress(b"x" * (1 << 20))

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, content=packed, headers={"content-encoding": "gzip"})

    async def go(provider_cls: Any) -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            stream = provider_cls(client).stream(_completion(USER), KEY, "http://upstream.test")
            _ = [c async for c in stream]

    for provider_cls in (AnthropicProvider, OpenAIProvider):
        with pytest.raises(ProviderError, match="Content-Encoding gzip,"):
            asyncio.run(go(provider_cls))
    assert [r.headers["accept-encoding"] for r in seen] == ["identity", "identity"]


def test_malformed_event_is_an_upstream_error() -> None:
    with pytest.raises(ProviderError, match="malformed event"):
        _run(AnthropicProvider, b"data: {not json\n\n", _completion(USER))


# -- what an upstream may send back -----------------------------------------------------------

MIB = 1 << 20


def _text_event(provider: type[AnthropicProvider] | type[OpenAIProvider], text: str) -> bytes:
    if provider is AnthropicProvider:
        return sse({"type": "content_block_delta", "delta": {"type": "text_delta", "text": text}})
    return sse({"choices": [{"index": 0, "delta": {"content": text}}]})


@pytest.mark.parametrize("provider", [AnthropicProvider, OpenAIProvider])
def test_an_event_line_over_a_mebibyte_is_refused(
    provider: type[AnthropicProvider] | type[OpenAIProvider],
) -> None:
    """httpx's aiter_lines held a line until its newline, however long it grew."""
    event = _text_event(provider, "A" * MIB)
    with pytest.raises(ProviderError, match=f"event line over {MIB} bytes"):
        _run(provider, event, _completion(USER), cut=64 * 1024)
    # With a newline that never comes, too: refused once the line is past the cap.
    with pytest.raises(ProviderError, match=f"event line over {MIB} bytes"):
        _run(provider, event[:-2], _completion(USER), cut=64 * 1024)


@pytest.mark.parametrize("provider", [AnthropicProvider, OpenAIProvider])
def test_an_answer_over_its_calls_cap_is_refused(
    provider: type[AnthropicProvider] | type[OpenAIProvider],
) -> None:
    """At most 1 MiB and 1 KiB a token of max_tokens (512 here: 1.5 MiB) in all."""
    events = [_text_event(provider, "A" * 32 * 1024) for _ in range(64)]  # 2 MiB of lines
    with pytest.raises(ProviderError, match=f"more than {MIB + 512 * 1024} bytes for one answer"):
        _run(provider, iter(events), _completion(USER), cut=64 * 1024)
    chunks, _ = _run(provider, iter(events[:40]), _completion(USER), cut=64 * 1024)  # 1.25 MiB
    assert len(_text(chunks)) == 40 * 32 * 1024


@pytest.mark.parametrize("provider", [AnthropicProvider, OpenAIProvider])
def test_tool_arguments_in_thousands_of_fragments_are_joined_whole(
    provider: type[AnthropicProvider] | type[OpenAIProvider],
) -> None:
    args = json.dumps({"path": "a", "content": "x" * 20_000})  # ~2,900 fragments
    turn = Turn(tool=("call_1", "write_file", args))
    stream = (anthropic_events if provider is AnthropicProvider else openai_events)(turn, "m")
    chunks, _ = _run(provider, stream, _completion(USER, tools=TOOLS), cut=64 * 1024)
    assert [c.tool_call for c in chunks if c.tool_call] == [ToolCall("call_1", "write_file", args)]


def test_crlf_lines_a_last_line_without_newline_and_done() -> None:
    text = _text_event(OpenAIProvider, "one").replace(b"\n", b"\r\n")
    last = _text_event(OpenAIProvider, " two").rstrip(b"\n")
    chunks, _ = _run(OpenAIProvider, text + last, _completion(USER), cut=3)
    assert _text(chunks) == "one two"
    after_done = b"data: [DONE]\n\n" + _text_event(OpenAIProvider, "never")
    chunks, _ = _run(OpenAIProvider, text + after_done, _completion(USER), cut=5)
    assert _text(chunks) == "one"


@pytest.mark.parametrize("cut", [1, 4, 9, 100_000])
def test_openai_text_stream(cut: int) -> None:
    text = "Hello from a chat completion stream."
    chunks, seen = _run(
        OpenAIProvider, openai_events(Turn(text=text), "gpt-x"), _completion(USER), cut=cut
    )
    assert _text(chunks) == text
    assert [c.usage for c in chunks if c.usage] == [(30, 8)]
    assert [c.stop_reason for c in chunks if c.stop_reason] == ["end_turn"]
    (request,) = seen
    assert str(request.url) == "http://upstream.test/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert "x-api-key" not in request.headers
    body = json.loads(request.content)
    assert body["messages"][0] == {"role": "system", "content": PERSONA}
    assert body["messages"][1:] == [{"role": "user", "content": "hi"}]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_openai_tool_call_from_argument_fragments() -> None:
    args = json.dumps({"path": "b.txt"})
    turn = Turn(tool=("call_1", "read_file", args))
    chunks, seen = _run(OpenAIProvider, openai_events(turn, "m"), _completion(USER, tools=TOOLS))
    assert [c.tool_call for c in chunks if c.tool_call] == [ToolCall("call_1", "read_file", args)]
    assert [c.stop_reason for c in chunks if c.stop_reason] == ["tool_use"]
    tools = json.loads(seen[0].content)["tools"]
    assert [(t["type"], t["function"]["name"]) for t in tools] == [
        ("function", "read_file"),
        ("function", "write_file"),
    ]


def test_openai_parallel_tool_calls_and_history() -> None:
    def chunk(delta: object, finish: str | None = None) -> str:
        doc = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return "data: " + json.dumps(doc) + "\n\n"

    stream = (
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "read_file",
                                                                    "arguments": '{"pa'}}]})
        + chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "list_files",
                                                                      "arguments": "{}"}}]})
        + chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'th": "x"}'}}]})
        + chunk({}, "tool_calls")
        + 'data: {"choices": [], "usage": null}\n\n'
        + "data: [DONE]\n\n"
    )  # fmt: skip
    call = ToolCall("a", "read_file", "{}")
    history = _completion(USER, Message("assistant", "", (call,)), Message("tool", "r", (), "a"))
    chunks, seen = _run(OpenAIProvider, stream.encode(), history)
    assert [c.tool_call for c in chunks if c.tool_call] == [
        ToolCall("a", "read_file", '{"path": "x"}'),
        ToolCall("b", "list_files", "{}"),
    ]
    assert not [c for c in chunks if c.usage]
    messages = json.loads(seen[0].content)["messages"]
    assert messages[2]["tool_calls"] == [
        {"id": "a", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    ]
    assert messages[3] == {"role": "tool", "tool_call_id": "a", "content": "r"}


def test_openai_without_a_key_sends_no_authorization() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=b"".join(openai_events(Turn(text="x"), "m")))

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            _ = [c async for c in OpenAIProvider(client).stream(_completion(USER), "", "http://o")]

    asyncio.run(go())
    assert "authorization" not in seen[0].headers


# -- the mock provider's script ---------------------------------------------------------------


def _mock(*messages: Message) -> list[Chunk]:
    async def go() -> list[Chunk]:
        return [c async for c in MockProvider().stream(_completion(*messages), "", "")]

    return asyncio.run(go())


def test_mock_loop_calls_a_tool_after_every_result() -> None:
    first = _mock(Message("user", "/loop"))
    (call,) = [c.tool_call for c in first if c.tool_call]
    assert call.name == "list_files"
    after = _mock(
        Message("user", "/loop"),
        Message("assistant", "", (call,)),
        Message("tool", "[]", (), call.id),
    )
    (again,) = [c.tool_call for c in after if c.tool_call]
    assert again.name == "list_files"
    assert again.id != call.id
    # A later message ends the loop: the mock answers it.
    assert _text(_mock(Message("user", "/loop"), Message("user", "hi"))) == "mock: hi"
