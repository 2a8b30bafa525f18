"""Anthropic Messages API (streaming). The key goes in ``x-api-key``, set here, host-side."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ironclawd.domain.model import Chunk, Completion, Message, ToolCall
from ironclawd.errors import ProviderError
from ironclawd.providers.base import (
    IDENTITY,
    Provider,
    answer_cap,
    raise_for_status,
    sse_events,
)

if TYPE_CHECKING:  # httpx loads at the first model call (issue 17: not at start)
    import httpx

API_VERSION = "2023-06-01"


def build(http: httpx.AsyncClient) -> Provider:
    return AnthropicProvider(http)


class AnthropicProvider:
    name = "anthropic"

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def stream(self, completion: Completion, key: str, base_url: str) -> AsyncIterator[Chunk]:
        body: dict[str, Any] = {
            "model": completion.model,
            "max_tokens": completion.max_tokens,
            "system": completion.system,
            "messages": [_message(m) for m in completion.messages],
            "stream": True,
        }
        if completion.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description,
                 "input_schema": json.loads(t.parameters_json)}
                for t in completion.tools
            ]  # fmt: skip
        headers = {"x-api-key": key, "anthropic-version": API_VERSION, **IDENTITY}
        url = base_url.rstrip("/") + "/v1/messages"
        async with self._client.stream("POST", url, json=body, headers=headers) as response:
            await raise_for_status(response, self.name)
            tool: tuple[str, str] | None = None  # the id and name of the tool call being read
            args: list[str] = []  # its argument fragments, joined once at its end
            input_tokens = 0
            async for event in sse_events(response, answer_cap(completion.max_tokens)):
                kind = event.get("type")
                if kind == "message_start":
                    input_tokens = int(event["message"].get("usage", {}).get("input_tokens", 0))
                    # Billed from here on: a call abandoned before message_delta is charged
                    # this input at least (the proxy keeps the latest usage it was given).
                    yield Chunk(usage=(input_tokens, 0))
                elif kind == "content_block_start":
                    block = event.get("content_block", {})
                    if block.get("type") == "tool_use":
                        tool, args = (block["id"], block["name"]), []
                elif kind == "content_block_delta":
                    delta = event.get("delta", {})
                    if delta.get("type") == "text_delta":
                        yield Chunk(text=str(delta.get("text", "")))
                    elif delta.get("type") == "input_json_delta" and tool is not None:
                        # A list, not ``str +=`` on a dict entry (which copies the whole string
                        # each time: 2 MiB in 64-byte pieces took 14 s of the event loop).
                        args.append(str(delta.get("partial_json", "")))
                elif kind == "content_block_stop" and tool is not None:
                    yield Chunk(tool_call=ToolCall(tool[0], tool[1], "".join(args) or "{}"))
                    tool, args = None, []
                elif kind == "message_delta":
                    output = int(event.get("usage", {}).get("output_tokens", 0))
                    yield Chunk(usage=(input_tokens, output))
                    reason = event.get("delta", {}).get("stop_reason")
                    if reason:
                        yield Chunk(stop_reason=str(reason))
                elif kind == "error":
                    raise ProviderError(f"anthropic: {event.get('error')}")


def _message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": message.tool_call_id,
                         "content": message.text}],
        }  # fmt: skip
    content: list[dict[str, Any]] = []
    if message.text:
        content.append({"type": "text", "text": message.text})
    for call in message.tool_calls:
        content.append({"type": "tool_use", "id": call.id, "name": call.name,
                        "input": json.loads(call.arguments_json or "{}")})  # fmt: skip
    return {"role": message.role, "content": content}
