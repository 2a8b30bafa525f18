"""MCP values: a server registered for an agent, the tool definitions it offers, and the tools
granted to the agent with their definitions pinned at approval. Pure values (no I/O).

A granted tool reaches the model as ``mcp__<server>__<tool>``: providers accept only
``[A-Za-z0-9_-]`` in function names, and a server name has no ``_``, so the first ``__`` after
the prefix ends the server name unambiguously.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from ironclawd import lazy_re

SERVER_NAME_RE = lazy_re.compile(r"[a-z][a-z0-9-]{0,31}")
TOOL_PREFIX = "mcp__"


def canonical_schema(schema: object) -> str:
    """A tool's input schema as the canonical JSON text that is stored, shown and hashed."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class McpToolDef:
    """A tool as a server describes it: what the approver reads and what is pinned."""

    name: str
    description: str
    input_schema: str  # canonical JSON (canonical_schema)

    @property
    def digest(self) -> str:
        """SHA-256 over name, description and schema: the pin a grant records."""
        body = json.dumps(
            {"name": self.name, "description": self.description, "input_schema": self.input_schema},
            sort_keys=True, separators=(",", ":"), ensure_ascii=False,
        )  # fmt: skip
        return hashlib.sha256(body.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class McpServer:
    """A server registered for one agent (each agent gets its own instance; nothing is shared).

    Exactly one of ``command`` (a stdio server the host runs in a hardened transient unit) and
    ``url`` (a remote server, reached only through the egress broker) is set."""

    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    env: tuple[tuple[str, str], ...] = ()  # plain settings, shown to the approver
    credentials: tuple[tuple[str, str], ...] = ()  # ENV -> host credential name (never a value)
    allow: tuple[str, ...] = ()  # HOST:PORT the server's unit may reach; none by default
    tools: tuple[McpToolDef, ...] = ()  # what the probe saw when it was registered


@dataclass(frozen=True)
class McpGrant:
    """One tool of one registered server granted to the agent, pinned to its definition."""

    server: str
    tool: str
    digest: str  # McpToolDef.digest at approval; a different live definition is refused

    @property
    def model_name(self) -> str:
        return model_tool_name(self.server, self.tool)


def model_tool_name(server: str, tool: str) -> str:
    return f"{TOOL_PREFIX}{server}__{tool}"


def split_model_tool_name(name: str) -> tuple[str, str] | None:
    """(server, tool) for ``mcp__<server>__<tool>``, or None if ``name`` is not one."""
    if not name.startswith(TOOL_PREFIX):
        return None
    server, sep, tool = name[len(TOOL_PREFIX) :].partition("__")
    if not sep or not tool or SERVER_NAME_RE.fullmatch(server) is None:
        return None
    return server, tool


@dataclass(frozen=True)
class McpLimits:
    """The daemon-wide ``[mcp]`` table: time-outs, caps, back-off and each server unit's limits
    (docs/mcp.md "Time-outs, caps and back-off")."""

    connect_timeout_seconds: float = 30.0  # unit start + the SDK's initialize
    list_timeout_seconds: float = 15.0
    call_timeout_seconds: float = 60.0
    max_output_bytes: int = 256 * 1024  # a tool's text reaches the caller cut to this
    max_message_bytes: int = 4 * 1024 * 1024  # one message from a server; past it, restarted
    backoff_initial_seconds: float = 1.0
    backoff_max_seconds: float = 60.0
    memory_max_bytes: int = 512 * 1024 * 1024
    tasks_max: int = 64
    cpu_quota_percent: int = 50
    # Each session's own bounds (services/mcp_budget.py): its calls in a sliding minute, and
    # the stops of its agent's servers counted against it (services/mcp_calls.py) that refuse
    # its calls.
    calls_per_minute: int = 60
    stops_per_session: int = 3
    stops_window_seconds: float = 600.0
