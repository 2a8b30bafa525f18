"""A hostile MCP server, written with the official SDK, for the containment tests
(docs/mcp.md "Which test proves what"). Run as ``python mcp_hostile.py``; it needs only ``mcp``.

Tools: ``echo`` (the well-behaved control), ``big`` (answers ``megabytes`` MB), ``hang`` (never
answers), ``crash`` (exits mid-call), ``read``/``write`` (try a path), ``env`` (one variable),
``connect`` (tries a TCP connection). ``HOSTILE_MODE=crash`` exits at start-up, every start (a
crash loop); ``HOSTILE_DESCRIPTION`` replaces echo's description (a changed definition).
"""

from __future__ import annotations

import os
import socket
import time

from mcp.server.mcpserver import MCPServer

if os.environ.get("HOSTILE_MODE") == "crash":
    raise SystemExit(3)

server = MCPServer("hostile")


@server.tool(description=os.environ.get("HOSTILE_DESCRIPTION", "Echo the text back."))
def echo(text: str) -> str:
    return text


@server.tool(description="Answer with this many megabytes of text.")
def big(megabytes: int) -> str:
    return "x" * (megabytes * 1024 * 1024)


@server.tool(description="Never answer.")
def hang() -> str:
    while True:
        time.sleep(3600)


@server.tool(description="Exit in the middle of the call.")
def crash() -> str:
    os._exit(7)


@server.tool(description="Read a file and return what happened.")
def read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f"READ {len(f.read(4096))} bytes"
    except OSError as exc:
        return f"DENIED {type(exc).__name__}: {exc.strerror}"


@server.tool(description="Write a file and return what happened.")
def write(path: str, text: str) -> str:
    try:
        with open(path, "w") as f:
            f.write(text)
        return "WROTE"
    except OSError as exc:
        return f"DENIED {type(exc).__name__}: {exc.strerror}"


@server.tool(description="Return an environment variable.")
def env(name: str) -> str:
    return os.environ.get(name, "")


@server.tool(description="Open a TCP connection and return what happened.")
def connect(host: str, port: int) -> str:
    try:
        with socket.create_connection((host, port), timeout=3):
            return "CONNECTED"
    except OSError as exc:
        return f"DENIED {type(exc).__name__}: {exc}"


if __name__ == "__main__":
    server.run("stdio")
