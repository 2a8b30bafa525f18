"""The model proxy's answer as Complete's stream events (ironclawd/api/sandbox.py ``_events``):
consecutive text from the provider is joined into one ``text_delta`` (each event is a write of the
daemon's and a read through the sandbox's sentry), never past the batch, and never across
another event, so the order of text, tool calls, usage and the stop reason is kept. And as
Answer's one message (``ModelServicer.Answer``): the text joined, the calls in order, and an
answer too large for one message refused by name."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from ironclaw.model.v1 import model_pb2
from ironclawd.api import sandbox, sandbox_calls
from ironclawd.domain.model import Chunk, ToolCall
from ironclawd.errors import ProviderError


async def _chunks(*chunks: Chunk) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


def _events(batch: int, *chunks: Chunk, only: bool = False) -> list[tuple[str, object]]:
    async def collect() -> list[model_pb2.CompleteResponse]:
        events = sandbox._events(_chunks(*chunks), batch, text_and_tool_calls_only=only)
        return [event async for event in events]

    out: list[tuple[str, object]] = []
    for event in asyncio.run(collect()):
        kind = event.WhichOneof("event")
        assert kind is not None
        value = getattr(event, kind)
        out.append((kind, value if isinstance(value, str) else type(value).__name__))
    return out


def test_text_is_joined_up_to_the_next_other_event() -> None:
    call = ToolCall("c1", "list_files", "{}")
    chunks = [
        Chunk(text="mock:"), Chunk(text=" hello"), Chunk(text=""), Chunk(text=" there"),
        Chunk(tool_call=call), Chunk(text="after"), Chunk(usage=(3, 4)),
        Chunk(stop_reason="end_turn"),
    ]  # fmt: skip
    assert _events(100, *chunks) == [
        ("text_delta", "mock: hello there"),
        ("tool_call", "ToolCall"),
        ("text_delta", "after"),
        ("usage", "Usage"),
        ("stop_reason", "end_turn"),
    ]


def test_a_caller_that_reads_only_text_and_tool_calls_gets_nothing_else() -> None:
    """What the agent asks for (agent/model.py): a plain answer is then one event, and the
    usage and stop reason between two texts no longer split them."""
    call = ToolCall("c1", "list_files", "{}")
    chunks = [
        Chunk(text="mock:"), Chunk(usage=(1, 2)), Chunk(text=" hello"), Chunk(tool_call=call),
        Chunk(text="after"), Chunk(stop_reason="tool_use"), Chunk(usage=(3, 4)),
    ]  # fmt: skip
    assert _events(100, *chunks, only=True) == [
        ("text_delta", "mock: hello"),
        ("tool_call", "ToolCall"),
        ("text_delta", "after"),
    ]
    plain = [Chunk(text="an"), Chunk(text=" answer"), Chunk(stop_reason="end_turn"),
             Chunk(usage=(5, 6))]  # fmt: skip
    assert _events(100, *plain, only=True) == [("text_delta", "an answer")]
    # Without the request's flag, both are sent as before.
    assert _events(100, *plain) == [
        ("text_delta", "an answer"), ("stop_reason", "end_turn"), ("usage", "Usage"),
    ]  # fmt: skip


def test_text_at_the_end_of_the_stream_is_sent() -> None:
    assert _events(100, Chunk(text="a"), Chunk(text="b")) == [("text_delta", "ab")]
    assert _events(100) == []


def test_an_event_holds_at_most_the_batch_and_one_chunk() -> None:
    chunks = [Chunk(text=c * 3) for c in "abcde"]
    assert _events(5, *chunks) == [
        ("text_delta", "aaabbb"),
        ("text_delta", "cccddd"),
        ("text_delta", "eee"),
    ]


def test_the_batch_follows_the_largest_message() -> None:
    assert sandbox.ModelServicer(None, 1024)._batch == 128  # type: ignore[arg-type]
    big = sandbox.ModelServicer(None, 64 * 1024 * 1024)  # type: ignore[arg-type]
    assert big._batch == sandbox.TEXT_BATCH_CHARS


class _Proxy:
    """The model proxy's ``complete`` as far as the servicer sees it: these chunks."""

    def __init__(self, *chunks: Chunk) -> None:
        self.chunks = chunks

    def complete(self, sid: str, messages: object, tools: object, max_tokens: int) -> Any:
        return _chunks(*self.chunks)


def _answer(max_bytes: int, *chunks: Chunk) -> model_pb2.AnswerResponse:
    servicer = sandbox.ModelServicer(cast(Any, _Proxy(*chunks)), max_bytes)
    request = model_pb2.CompleteRequest(
        messages=[model_pb2.Message(role=model_pb2.ROLE_USER, text="hi")]
    )

    async def call() -> model_pb2.AnswerResponse:
        sandbox_calls.CURRENT_PEER.set(cast(Any, SimpleNamespace(sid="s1")))
        return await servicer.Answer(request, cast(Any, None))

    return asyncio.run(call())


def test_answer_is_the_whole_turn_in_one_message_text_joined_and_calls_in_order() -> None:
    first, second = ToolCall("c1", "list_files", "{}"), ToolCall("c2", "read_file", '{"p": 1}')
    answer = _answer(
        4096,
        Chunk(text="mock:"), Chunk(text=" hello"), Chunk(tool_call=first), Chunk(text=" there"),
        Chunk(tool_call=second), Chunk(usage=(3, 4)), Chunk(stop_reason="tool_use"),
    )  # fmt: skip
    assert answer.text == "mock: hello there"
    assert [(c.id, c.name, c.arguments_json) for c in answer.tool_calls] == [
        ("c1", "list_files", "{}"),
        ("c2", "read_file", '{"p": 1}'),
    ]


def test_an_answer_larger_than_one_message_is_refused_by_name() -> None:
    assert _answer(1024, Chunk(text="x" * 1000)).text == "x" * 1000
    with pytest.raises(ProviderError, match=r"larger than one message on model.sock.*1024"):
        _answer(1024, Chunk(text="x" * 1100))
