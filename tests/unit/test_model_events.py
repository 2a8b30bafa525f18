"""The model proxy's answer as Complete's stream events (ironclawd/api/sandbox.py ``_events``):
consecutive text from the provider is joined into one ``text_delta`` (each event is a write of the
daemon's and a read through the sandbox's sentry), never past the batch, and never across
another event, so the order of text, tool calls, usage and the stop reason is kept."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ironclaw.model.v1 import model_pb2
from ironclawd.api import sandbox
from ironclawd.domain.model import Chunk, ToolCall


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
