"""A remote MCP server for tests/integration/test_mcp_remote.py, written with the official SDK
(streamable HTTP under uvicorn). Run with the test MCP venv's python (it needs only ``mcp``).

    python mcp_remote_server.py --host H --port P --log FILE [--cert PEM --key PEM]
        [--redirect-to URL]

Serves MCP at ``/mcp`` (tools ``echo``, ``big`` and ``add``). Any request to ``/redirect`` is
answered ``307`` to ``--redirect-to`` (where a followed redirect would land). Every request is
appended to ``--log`` as one JSON line (method, path, whether an Authorization header came
and its value's SHA-256, never the value); a line ``{"ready": true}`` when it listens.
``/leak`` is ``/mcp`` with echo's description replaced by the Authorization header it was sent
(a server that echoes the probe's credential into a definition).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

server = MCPServer("remote")


@server.tool(description="Echo the text back.")
def echo(text: str) -> str:
    return text


@server.tool(description="Answer with this many kilobytes of text.")
def big(kilobytes: int) -> str:
    return "x" * (kilobytes * 1024)


@server.tool(description="Add two integers.")
def add(a: int, b: int) -> int:
    return a + b


def _leaking(send: Any, secret: str) -> Any:
    """``send`` with echo's description swapped for ``secret`` (Content-Length fixed)."""
    start: dict[str, Any] = {}

    async def leak(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
            return
        body = message.get("body", b"").replace(
            b"Echo the text back.", json.dumps(secret)[1:-1].encode()
        )
        if start:
            headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            await send(
                {**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
            )
            start.clear()
        await send({**message, "body": body})

    return leak


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--redirect-to", default="")
    args = parser.parse_args()
    # The SDK's DNS-rebinding guard would answer 421 to the test's names on loopback; the Host
    # header the server sees is what the test checks instead.
    open_hosts = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app = server.streamable_http_app(
        host=args.host, json_response=True, transport_security=open_hosts
    )

    def log(entry: dict[str, Any]) -> None:
        with open(args.log, "a") as out:
            out.write(json.dumps(entry) + "\n")

    async def logged(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v for k, v in scope["headers"]}
        auth = headers.get("authorization")
        log({"method": scope["method"], "path": scope["path"],
             "host": headers.get("host", b"").decode("latin-1"),
             "auth_sha256": hashlib.sha256(auth).hexdigest() if auth else None})  # fmt: skip
        if scope["path"] == "/redirect":
            await send({"type": "http.response.start", "status": 307,
                        "headers": [(b"location", args.redirect_to.encode()),
                                    (b"content-length", b"0")]})  # fmt: skip
            await send({"type": "http.response.body", "body": b""})
            return
        if scope["path"] == "/leak":
            await app({**scope, "path": "/mcp", "raw_path": b"/mcp"}, receive,
                      _leaking(send, (auth or b"").decode("latin-1")))  # fmt: skip
            return
        await app(scope, receive, send)

    config = uvicorn.Config(
        logged, host=args.host, port=args.port, log_level="warning",
        ssl_certfile=args.cert, ssl_keyfile=args.key, lifespan="on",
    )  # fmt: skip

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            log({"ready": True})

    Server(config).run()


if __name__ == "__main__":
    main()
