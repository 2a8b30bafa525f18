"""The offline, deterministic mock model: the default, so tests and the demo need no key.

Scriptable from the conversation, so every tool path can be exercised:
- a user message ``/tool NAME {json args}`` makes it call that tool;
- after a tool result it answers ``tool NAME said: <result>``;
- ``/fail`` makes it fail like an upstream error; anything else gets ``mock: <text>``.
Text is streamed word by word; usage counts words.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

from ironclawd.domain.model import Chunk, Completion, ToolCall
from ironclawd.providers.base import ProviderError


class MockProvider:
    name = "mock"

    async def stream(self, completion: Completion, key: str, base_url: str) -> AsyncIterator[Chunk]:
        last = completion.messages[-1]
        words_in = sum(len(m.text.split()) for m in completion.messages) + len(
            completion.system.split()
        )
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


def _find_call(completion: Completion, call_id: str) -> str:
    for message in reversed(completion.messages):
        for call in message.tool_calls:
            if call.id == call_id:
                return call.name
    return "?"
