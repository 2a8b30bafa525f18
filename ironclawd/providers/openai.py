"""OpenAI-compatible Chat Completions (OpenAI, OpenRouter, Ollama, vLLM, llama.cpp servers),
streaming. The key goes in ``Authorization: Bearer``, set here, host-side."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ironclawd.domain.model import Chunk, Completion, Message, ToolCall
from ironclawd.providers.base import (
    IDENTITY,
    Provider,
    answer_cap,
    raise_for_status,
    sse_events,
)

if TYPE_CHECKING:  # httpx loads at the first model call (issue 17: not at start)
    import httpx


def build(http: httpx.AsyncClient) -> Provider:
    return OpenAIProvider(http)


class OpenAIProvider:
    name = "openai"

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def stream(self, completion: Completion, key: str, base_url: str) -> AsyncIterator[Chunk]:
        messages = [{"role": "system", "content": completion.system}]
        messages += [_message(m) for m in completion.messages]
        body: dict[str, Any] = {
            "model": completion.model,
            "max_tokens": completion.max_tokens,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if completion.tools:
            body["tools"] = [
                {"type": "function", "function": {
                    "name": t.name, "description": t.description,
                    "parameters": json.loads(t.parameters_json)}}
                for t in completion.tools
            ]  # fmt: skip
        headers = {**({"Authorization": f"Bearer {key}"} if key else {}), **IDENTITY}
        url = base_url.rstrip("/") + "/chat/completions"
        calls: dict[int, _Call] = {}
        async with self._client.stream("POST", url, json=body, headers=headers) as response:
            await raise_for_status(response, self.name)
            finish = ""
            async for event in sse_events(response, answer_cap(completion.max_tokens)):
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        yield Chunk(text=str(delta["content"]))
                    for part in delta.get("tool_calls") or []:
                        call = calls.setdefault(int(part.get("index", 0)), _Call())
                        function = part.get("function") or {}
                        call.id = part.get("id") or call.id
                        call.name.append(function.get("name") or "")
                        call.args.append(function.get("arguments") or "")
                    if choice.get("finish_reason"):
                        finish = str(choice["finish_reason"])
                usage = event.get("usage")
                if usage:
                    yield Chunk(usage=(int(usage.get("prompt_tokens", 0)),
                                       int(usage.get("completion_tokens", 0))))  # fmt: skip
        for index in sorted(calls):
            call = calls[index]
            yield Chunk(tool_call=ToolCall(call.id, "".join(call.name), "".join(call.args) or "{}"))
        yield Chunk(stop_reason={"tool_calls": "tool_use", "stop": "end_turn"}.get(finish, finish))


@dataclass
class _Call:
    """One tool call as its fragments arrive, joined once at the end: ``str +=`` on a dict
    entry copies the whole string each time (2 MiB in 64-byte pieces took 14 s of the loop)."""

    id: str = ""
    name: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)


def _message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.text}
    out: dict[str, Any] = {"role": message.role, "content": message.text}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments_json}}
            for c in message.tool_calls
        ]  # fmt: skip
    return out
