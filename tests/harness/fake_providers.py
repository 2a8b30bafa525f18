"""Fake Anthropic Messages and OpenAI-compatible Chat Completions servers for tests and
benchmarks: they record exactly what they receive (path, headers, body) and answer with the
event streams the real APIs send (text split across events, a tool call whose arguments arrive
in fragments, usage), chunk-encoded and flushed event by event.

What they answer is chosen by the text of the last user message, so a test drives them through
the real agent:

- a tool result last: ``tool result: <its text>``;
- ``/tool NAME {json}``: a tool call (the arguments cut into fragments);
- ``/echo-key-text``: the API key the request carried, in text split three characters an event;
- ``/echo-key-tool``: the key as a tool call's id and argument (``write_file`` of ``leak.txt``);
- ``/echo-key-escaped``: the key in a tool argument, every character a JSON ``\\uXXXX`` escape;
- ``/echo-key-401``: HTTP 401 whose body echoes the key (as some gateways echo headers);
- anything else: ``fake <provider> says: <text>``, a few characters an event.

Standard library only; listens on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TEXT_PIECE = 5
ARGS_PIECE = 7


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


@dataclass(frozen=True)
class Turn:
    """What the fake model does: text, or one tool call."""

    text: str = ""
    tool: tuple[str, str, str] | None = None  # id, name, arguments JSON text
    text_piece: int = TEXT_PIECE


def choose(provider: str, key: str, last_text: str, last_is_tool: bool) -> Turn | int:
    """The fake's answer to a conversation ending in ``last_text``; an int is an HTTP error."""
    if last_is_tool:
        return Turn(text=f"tool result: {last_text}")
    if last_text.startswith("/tool "):
        name, _, args = last_text[len("/tool ") :].partition(" ")
        return Turn(tool=(f"call_{abs(hash(last_text)) % 10**8}", name, args.strip() or "{}"))
    if last_text == "/echo-key-text":
        return Turn(text=f"the key you sent is {key} and that is all", text_piece=3)
    if last_text == "/echo-key-tool":
        args = json.dumps({"path": "leak.txt", "content": f"key={key}"})
        return Turn(tool=(f"toolu_{key}", "write_file", args))
    if last_text == "/echo-key-escaped":
        escaped = "".join(f"\\u{ord(c):04x}" for c in key)
        return Turn(
            tool=("toolu_esc", "write_file", '{"path": "esc.txt", "content": "' + escaped + '"}')
        )
    if last_text == "/echo-key-401":
        return 401
    return Turn(text=f"fake {provider} says: {last_text}")


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + json.dumps(data) + "\n\n").encode()


def anthropic_events(turn: Turn, model: str, input_tokens: int = 25) -> Iterator[bytes]:
    """A Messages API stream, as the real one orders its events."""
    yield sse(
        {
            "type": "message_start",
            "message": {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": model,
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": input_tokens, "output_tokens": 1},
            },
        },
        "message_start",
    )
    yield sse({"type": "ping"}, "ping")
    out = 0
    if turn.tool is None:
        yield sse(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            "content_block_start",
        )
        for part in pieces(turn.text, turn.text_piece):
            out += 1
            yield sse(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": part},
                },
                "content_block_delta",
            )
        yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
        reason = "end_turn"
    else:
        call_id, name, args = turn.tool
        yield sse(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}},
            },
            "content_block_start",
        )
        for part in ["", *pieces(args, ARGS_PIECE)]:
            out += 1
            yield sse(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "input_json_delta", "partial_json": part},
                },
                "content_block_delta",
            )
        yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
        reason = "tool_use"
    yield sse(
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": {"output_tokens": out},
        },
        "message_delta",
    )
    yield sse({"type": "message_stop"}, "message_stop")


def openai_events(turn: Turn, model: str, input_tokens: int = 30) -> Iterator[bytes]:
    """A Chat Completions stream with ``stream_options.include_usage``."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    yield chunk({"role": "assistant", "content": ""})
    out = 0
    if turn.tool is None:
        for part in pieces(turn.text, turn.text_piece):
            out += 1
            yield chunk({"content": part})
        yield chunk({}, "stop")
    else:
        call_id, name, args = turn.tool
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }
                ]
            }
        )
        for part in pieces(args, ARGS_PIECE):
            out += 1
            yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
        yield chunk({}, "tool_calls")
    yield sse(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": model,
            "choices": [],
            "usage": {
                "prompt_tokens": input_tokens,
                "completion_tokens": out,
                "total_tokens": input_tokens + out,
            },
        }
    )
    yield b"data: [DONE]\n\n"


def last_user_turn(provider: str, body: dict[str, Any]) -> tuple[str, bool]:
    """(text of the last message, whether it is a tool result) in either API's shape."""
    last = (body.get("messages") or [{}])[-1]
    if provider == "openai":
        return str(last.get("content") or ""), last.get("role") == "tool"
    content = last.get("content")
    if isinstance(content, str):
        return content, False
    for block in content or []:
        if block.get("type") == "tool_result":
            return str(block.get("content", "")), True
        if block.get("type") == "text":
            return str(block.get("text", "")), False
    return "", False


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    raw: bytes


@dataclass
class FakeProvider:
    """One fake API server: ``provider`` is "anthropic" or "openai"."""

    provider: str
    requests: list[Recorded] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        suffix = "/v1" if self.provider == "openai" else ""
        return f"http://127.0.0.1:{self.port}{suffix}"

    def start(self) -> FakeProvider:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # as real SSE servers: each event goes out at once

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {}
                record = Recorded("POST", self.path, dict(self.headers.items()), body, raw)
                with fake._lock:
                    fake.requests.append(record)
                fake._answer(self, record)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def key_of(self, record: Recorded) -> str:
        headers = {k.lower(): v for k, v in record.headers.items()}
        if self.provider == "anthropic":
            return headers.get("x-api-key", "")
        return headers.get("authorization", "").removeprefix("Bearer ")

    def _answer(self, handler: BaseHTTPRequestHandler, record: Recorded) -> None:
        expected = "/v1/messages" if self.provider == "anthropic" else "/v1/chat/completions"
        if record.path != expected:
            self._plain(handler, 404, b'{"error": "not found"}')
            return
        text, is_tool = last_user_turn(self.provider, record.body)
        turn = choose(self.provider, self.key_of(record), text, is_tool)
        if isinstance(turn, int):
            # As a misbehaving gateway might: the credential it was given, echoed in the body.
            error = {
                "type": "error",
                "error": {
                    "type": "authentication_error",
                    "message": f"invalid x-api-key / Authorization: {self.key_of(record)}",
                },
            }
            self._plain(handler, turn, json.dumps(error).encode())
            return
        model = str(record.body.get("model", ""))
        events = anthropic_events if self.provider == "anthropic" else openai_events
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for event in events(turn, model):
            handler.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            handler.wfile.flush()
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()

    @staticmethod
    def _plain(handler: BaseHTTPRequestHandler, status: int, data: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
