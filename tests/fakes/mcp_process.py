"""A scripted stand-in for the process ``anyio.open_process`` starts, for unit tests of the MCP
supervisor and transport against servers that misbehave on purpose (no subprocess): its stdin
feeds a Python handler, one JSON-RPC request a line, and what the handler returns (or what the
test sends on ``out_send``) is its stdout. The real transport (``host/mcp.bounded_stdio``), the
real supervisor and the SDK's client session read it as they would a server's pipes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import pytest

Handler = Callable[[dict[str, Any]], list[bytes]]


class _Stdin:
    def __init__(self, proc: ScriptedProcess) -> None:
        self._proc = proc
        self._buffer = b""
        self.closed = False

    async def send(self, data: bytes) -> None:
        if self.closed:
            raise anyio.ClosedResourceError
        self._buffer += data
        while b"\n" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\n", 1)
            for out in self._proc.handler(json.loads(raw)):
                await self._proc.out_send.send(out + b"\n")

    async def aclose(self) -> None:
        self.closed = True


class ScriptedProcess:
    pid = 424242

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.out_send, self.stdout = anyio.create_memory_object_stream[bytes](1 << 16)
        self.err_send, self.stderr = anyio.create_memory_object_stream[bytes](1 << 16)
        self.stdin = _Stdin(self)
        self.killed = False

    def kill(self) -> None:
        self.killed = True
        self.out_send.close()
        self.err_send.close()

    async def aclose(self) -> None:
        self.kill()
        self.stdout.close()
        self.stderr.close()


def install(monkeypatch: pytest.MonkeyPatch, handler: Handler) -> list[ScriptedProcess]:
    """Make every ``anyio.open_process`` a ScriptedProcess running ``handler``; the list holds
    them in order of start."""
    started: list[ScriptedProcess] = []

    async def open_process(argv: list[str], **kwargs: Any) -> ScriptedProcess:
        proc = ScriptedProcess(handler)
        started.append(proc)
        return proc

    monkeypatch.setattr(anyio, "open_process", open_process)
    return started


def line(obj: object) -> bytes:
    return json.dumps(obj).encode()


def initialized(rid: object) -> bytes:
    return line({"jsonrpc": "2.0", "id": rid, "result": {
        "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
        "serverInfo": {"name": "scripted", "version": "1"}}})  # fmt: skip


def answering(
    tools: Callable[[], list[dict[str, Any]]], call: Callable[[dict[str, Any]], dict[str, Any]]
) -> Handler:
    """A server that answers initialize, tools/list with ``tools()`` and tools/call with
    ``call(params)``; notifications get nothing."""

    def handle(req: dict[str, Any]) -> list[bytes]:
        method, rid = req.get("method"), req.get("id")
        if rid is None:
            return []
        if method == "initialize":
            return [initialized(rid)]
        if method == "tools/list":
            return [line({"jsonrpc": "2.0", "id": rid, "result": {"tools": tools()}})]
        if method == "tools/call":
            return [line({"jsonrpc": "2.0", "id": rid, "result": call(req["params"])})]
        return [line({"jsonrpc": "2.0", "id": rid, "result": {}})]

    return handle
