"""The offline, deterministic mock model: the default, so tests and the demo need no key.

Scriptable from the conversation, so every tool path can be exercised:
- a user message ``/tool NAME {json args}`` makes it call that tool;
- after a tool result it answers ``tool NAME said: <result>``;
- ``/loop`` makes it call ``list_files`` again after every tool result, never answering (the
  agent's bound on tool rounds must end the turn);
- ``/fail`` makes it fail like an upstream error; anything else gets ``mock: <text>``.
Text is streamed word by word; usage counts words.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ironclawd.domain.model import Chunk, Completion, ToolCall
from ironclawd.errors import ProviderError
from ironclawd.ports import Provider

if TYPE_CHECKING:  # httpx loads at the first model call (issue 17: not at start)
    import httpx


def build(http: httpx.AsyncClient) -> Provider:
    return MockProvider()  # offline: it never uses the client


class MockProvider:
    name = "mock"

    async def stream(self, completion: Completion, key: str, base_url: str) -> AsyncIterator[Chunk]:
        last = completion.messages[-1]
        words_in = sum(len(m.text.split()) for m in completion.messages) + len(
            completion.system.split()
        )
        if _turn_text(completion).startswith("/loop"):
            rounds = sum(1 for m in completion.messages if m.role == "tool")
            yield Chunk(tool_call=ToolCall(f"call_loop_{rounds}", "list_files", "{}"))
            yield Chunk(usage=(words_in, 1))
            yield Chunk(stop_reason="tool_use")
            return
        if last.role == "tool":
            call = _find_call(completion, last.tool_call_id)
            reply = f"tool {call} said: {last.text}"
        elif last.text.startswith("/fail"):
            raise ProviderError("mock: upstream failure requested by /fail")
        elif last.text.startswith("/tool "):
            name, _, args = last.text[len("/tool ") :].partition(" ")
            digest = hashlib.sha256(last.text.encode()).hexdigest()[:12]
            yield Chunk(tool_call=ToolCall(f"call_{digest}", name.strip(), args.strip() or "{}"))
            yield Chunk(usage=(words_in, 1))
            yield Chunk(stop_reason="tool_use")
            return
        else:
            reply = f"mock: {last.text}"
        words = reply.split(" ")
        for index, word in enumerate(words):
            yield Chunk(text=word if index == 0 else " " + word)
        yield Chunk(usage=(words_in, len(words)))
        yield Chunk(stop_reason="end_turn")


def _turn_text(completion: Completion) -> str:
    """The text of the user message this turn answers (the last one)."""
    for message in reversed(completion.messages):
        if message.role == "user":
            return message.text
    return ""


def _find_call(completion: Completion, call_id: str) -> str:
    for message in reversed(completion.messages):
        for call in message.tool_calls:
            if call.id == call_id:
                return call.name
    return "?"
