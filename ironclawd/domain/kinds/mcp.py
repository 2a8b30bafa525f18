"""``mcp``: register or unregister an MCP server for the agent, or grant some of its tools.

Three operations (``op``), each its own payload shape (docs/mcp.md "Registration"):

- ``register``: ``{"op": "register", "server": {name, command, env, credentials, allow, tools}}``
  adds the server (or replaces one of that name; its grants stay pinned to the definitions the
  human approved, so a changed definition is refused until granted again). Only an operator may
  register: a command is code the host runs.
- ``unregister``: ``{"op": "unregister", "server": NAME}`` removes it and its grants.
- ``grant``: ``{"op": "grant", "server": NAME, "tools": [TOOL, ...]}`` replaces the server's grants
  (empty revokes them), each pinned at apply to the digest of the definition in the registered
  server's ``tools`` (what the human saw when it was registered).
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ironclawd import lazy_re
from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.kinds.base import ChangeKind, only
from ironclawd.domain.mcp import (
    SERVER_NAME_RE,
    McpGrant,
    McpServer,
    McpToolDef,
    canonical_schema,
    model_tool_name,
)
from ironclawd.domain.mcp_url import parse_url
from ironclawd.errors import Conflict, InvalidArgument, PolicyDenied

MAX_ARGS = 64
MAX_ARG_CHARS = 4096
MAX_ENV = 32
MAX_ALLOW = 16
MAX_TOOLS = 128
MAX_DESCRIPTION = 8192
MAX_SCHEMA = 65536
ENV_RE = lazy_re.compile(r"[A-Z_][A-Z0-9_]{0,63}")
CREDENTIAL_RE = lazy_re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")  # store/credentials.py NAME_RE
TOOL_RE = lazy_re.compile(r"[A-Za-z0-9_.-]{1,128}")
# A model-facing function name: providers accept [A-Za-z0-9_-]{1,64} (domain/mcp.py).
MODEL_NAME_RE = lazy_re.compile(r"[A-Za-z0-9_-]{1,64}")
HOST_PORT_RE = lazy_re.compile(
    r"(?P<host>[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):(?P<port>\d{1,5})"
)
# Environment a registration may not set: the dynamic loader's and the interpreter's hooks would
# run code the approver did not see in the command line.
FORBIDDEN_ENV = lazy_re.compile(
    r"LD_.*|PYTHON(STARTUP|PATH|HOME|INSPECT)|BASH_ENV|ENV|NODE_OPTIONS"
)
# A remote server's credential goes in a request header; these the transport owns (framing,
# the pinned Host, the SDK's session and protocol headers).
HEADER_RE = lazy_re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")
FORBIDDEN_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer",
    "keep-alive", "proxy-authorization", "accept", "content-type", "mcp-session-id",
    "mcp-protocol-version", "last-event-id",
})  # fmt: skip


@dataclass(frozen=True)
class McpChange:
    op: str  # register | unregister | grant
    server: McpServer | None = None  # register
    name: str = ""  # unregister, grant
    tools: tuple[str, ...] = ()  # grant


def server_view(server: McpServer) -> dict[str, Any]:
    """A registered server as the approver reads it: credential names, never values."""
    remote = {"url": server.url} if server.url else {}
    if server.url:
        endpoint = parse_url(server.url)
        network: list[str] | str = [f"{endpoint.authority} (remote, via the egress broker's rules)"]
    else:
        network = list(server.allow) or "none"
    return {
        "name": server.name,
        "command": list(server.command),
        **remote,
        "env": {k: v for k, v in server.env},
        "credentials": {k: f"<host credential {name}>" for k, name in server.credentials},
        "network": network,
        "tools": [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in server.tools
        ],
    }


def server_to_mapping(server: McpServer) -> dict[str, Any]:
    """The canonical JSON form of a server in a register payload (parses back the same)."""
    return {
        "name": server.name,
        "command": list(server.command),
        **({"url": server.url} if server.url else {}),
        "env": [list(kv) for kv in server.env],
        "credentials": [list(kv) for kv in server.credentials],
        "allow": list(server.allow),
        "tools": [dataclasses.asdict(t) for t in server.tools],
    }


class McpKind(ChangeKind[McpChange]):
    name = "mcp"

    def parse(self, payload: Mapping[str, Any]) -> McpChange:
        op = payload.get("op")
        if op == "register":
            only(payload, self.name, {"op", "server"})
            return McpChange("register", server=parse_server(payload.get("server")))
        if op == "unregister":
            only(payload, self.name, {"op", "server"})
            return McpChange("unregister", name=_server_name(payload.get("server")))
        if op == "grant":
            only(payload, self.name, {"op", "server", "tools"})
            tools = payload.get("tools")
            if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
                raise InvalidArgument("payload.tools: expected a list of tool names")
            if len(tools) > MAX_TOOLS:
                raise InvalidArgument(f"payload.tools: expected at most {MAX_TOOLS} tools")
            return McpChange(
                "grant", name=_server_name(payload.get("server")),
                tools=tuple(sorted(set(tools))),
            )  # fmt: skip
        raise InvalidArgument(f"payload.op: expected register, unregister or grant, got {op!r}")

    def dump(self, payload: McpChange) -> dict[str, Any]:
        if payload.op == "register":
            assert payload.server is not None
            return {"op": "register", "server": server_to_mapping(payload.server)}
        if payload.op == "unregister":
            return {"op": "unregister", "server": payload.name}
        return {"op": "grant", "server": payload.name, "tools": list(payload.tools)}

    def apply(self, spec: AgentSpec, payload: McpChange) -> AgentSpec:
        servers = {s.name: s for s in spec.mcp_servers}
        if payload.op == "register":
            assert payload.server is not None
            servers[payload.server.name] = payload.server
            return dataclasses.replace(spec, mcp_servers=tuple(sorted(
                servers.values(), key=lambda s: s.name)))  # fmt: skip
        if payload.name not in servers:
            raise Conflict(
                f"MCP server '{payload.name}' is not registered for agent '{spec.name}' "
                f"(registered: {', '.join(sorted(servers)) or 'none'})"
            )
        others = tuple(g for g in spec.mcp_grants if g.server != payload.name)
        if payload.op == "unregister":
            # A skill's grants of the server's tools would outlive it, unseen, and come back
            # with a server registered again under the name (found by a review).
            holding = sorted({s.name for s in spec.skills
                              for g in s.grants.mcp_tools if g.server == payload.name})  # fmt: skip
            if holding:
                raise Conflict(
                    f"MCP server '{payload.name}' has tools granted by skill(s) "
                    f"{', '.join(holding)} of agent '{spec.name}': remove them first"
                )
            del servers[payload.name]
            return dataclasses.replace(spec, mcp_servers=tuple(servers.values()), mcp_grants=others)
        offered = {t.name: t for t in servers[payload.name].tools}
        unknown = [t for t in payload.tools if t not in offered]
        if unknown:
            raise Conflict(
                f"MCP server '{payload.name}' offers no tool {', '.join(unknown)} "
                f"(it offers: {', '.join(sorted(offered)) or 'none'})"
            )
        unnamed = [t for t in payload.tools if not grantable(payload.name, t)]
        if unnamed:
            raise Conflict(
                f"MCP tool(s) {', '.join(unnamed)} of '{payload.name}' cannot be offered to a "
                "model: mcp__<server>__<tool> must be [A-Za-z0-9_-], at most 64 chars"
            )
        granted = tuple(McpGrant(payload.name, t, offered[t].digest) for t in payload.tools)
        return dataclasses.replace(spec, mcp_grants=tuple(sorted(
            [*others, *granted], key=lambda g: (g.server, g.tool))))  # fmt: skip

    def view(self, spec: AgentSpec) -> dict[str, Any]:
        # Only when there are any: changes submitted before MCP existed keep their `before`.
        out: dict[str, Any] = {}
        if spec.mcp_servers:
            out["mcp_servers"] = [server_view(s) for s in spec.mcp_servers]
        if spec.mcp_grants:
            out["mcp_grants"] = [
                {"tool": g.model_name, "server": g.server, "name": g.tool, "digest": g.digest}
                for g in spec.mcp_grants
            ]
        return out

    def authorize(self, payload: McpChange, submitter: str) -> None:
        # Registering names a command the host runs: code execution on the host, so only an
        # operator may ask for it. A session may ask for grants of its agent's servers' tools.
        if payload.op == "register" and not submitter.startswith("uid:"):
            raise PolicyDenied("registering an MCP server can only come from an operator")


def _server_name(raw: object) -> str:
    if not isinstance(raw, str) or SERVER_NAME_RE.fullmatch(raw) is None:
        raise InvalidArgument(
            f"payload.server: expected a server name [a-z][a-z0-9-]{{0,31}}, got {raw!r}"
        )
    return raw


def parse_server(raw: object) -> McpServer:
    """A register payload's server, checked field by field (also used for probe requests)."""
    if not isinstance(raw, dict):
        raise InvalidArgument("payload.server: expected an object with name, command, tools, ...")
    only(raw, "mcp", {"name", "command", "url", "env", "credentials", "allow", "tools"})
    name = _server_name(raw.get("name"))
    if raw.get("url") is not None:
        return _remote_server(name, raw)
    return McpServer(
        name=name,
        command=parse_command(raw.get("command")),
        env=_pairs(raw.get("env", []), "env", _env_value),
        credentials=_pairs(raw.get("credentials", []), "credentials", _credential_name),
        allow=parse_allow(raw.get("allow", [])),
        tools=_tools(raw.get("tools", [])),
    )


def _remote_server(name: str, raw: dict[str, Any]) -> McpServer:
    """A remote server: a URL and header credentials; nothing the host runs, and its network is
    the URL's host alone (through the egress broker's rules, not an ``allow`` list)."""
    where = "payload.server"
    for field in ("command", "env", "allow"):
        if raw.get(field):
            raise InvalidArgument(
                f"{where}.{field}: a remote server (url) has no {field}; it is only reached at "
                "its URL"
            )
    url = raw.get("url")
    parse_url(url)
    assert isinstance(url, str)
    return McpServer(
        name=name,
        url=url,
        credentials=_pairs(
            raw.get("credentials", []),
            "credentials",
            _credential_name,
            key_re=HEADER_RE,
            key_check=_header_name,
        ),
        tools=_tools(raw.get("tools", [])),
    )


def _header_name(key: str) -> None:
    if key.lower() in FORBIDDEN_HEADERS:
        raise InvalidArgument(
            f"payload.server.credentials: {key} may not carry a credential (the transport sets it)"
        )


def parse_command(raw: object) -> tuple[str, ...]:
    where = "payload.server.command"
    if (
        not isinstance(raw, list) or not raw or len(raw) > MAX_ARGS
        or not all(isinstance(a, str) and len(a) <= MAX_ARG_CHARS and "\0" not in a for a in raw)
    ):  # fmt: skip
        raise InvalidArgument(
            f"{where}: expected an argv of 1 to {MAX_ARGS} strings without NUL "
            f"(at most {MAX_ARG_CHARS} chars each)"
        )
    exe = raw[0]
    if not exe.startswith("/") or posixpath.normpath(exe) != exe or exe.startswith("//"):
        raise InvalidArgument(
            f"{where}[0]: expected an absolute, normalised executable path, got {exe!r} "
            "(the unit does not search PATH)"
        )
    return tuple(raw)


def parse_allow(raw: object) -> tuple[str, ...]:
    where = "payload.server.allow"
    if not isinstance(raw, list) or len(raw) > MAX_ALLOW:
        raise InvalidArgument(f"{where}: expected a list of at most {MAX_ALLOW} HOST:PORT")
    for item in raw:
        match = HOST_PORT_RE.fullmatch(item) if isinstance(item, str) else None
        if match is None or not 1 <= int(match.group("port")) <= 65535:
            raise InvalidArgument(f"{where}: expected HOST:PORT (port 1-65535), got {item!r}")
    return tuple(dict.fromkeys(raw))


def _env_value(key: str, value: object) -> str:
    if FORBIDDEN_ENV.fullmatch(key):
        raise InvalidArgument(f"payload.server.env: {key} may not be set (it loads code)")
    if not isinstance(value, str) or len(value) > MAX_ARG_CHARS or "\0" in value:
        raise InvalidArgument(f"payload.server.env.{key}: expected text without NUL")
    return value


def _credential_name(key: str, value: object) -> str:
    if not isinstance(value, str) or CREDENTIAL_RE.fullmatch(value) is None:
        raise InvalidArgument(
            f"payload.server.credentials.{key}: expected a host credential name "
            f"[a-z0-9][a-z0-9_.-]{{0,63}}, got {value!r}"
        )
    return value


def _pairs(
    raw: object,
    field: str,
    check: Any,
    key_re: lazy_re.LazyPattern = ENV_RE,
    key_check: Any = lambda key: None,
) -> tuple[tuple[str, str], ...]:
    items = list(raw.items()) if isinstance(raw, dict) else raw
    where = f"payload.server.{field}"
    if not isinstance(items, list) or len(items) > MAX_ENV:
        raise InvalidArgument(f"{where}: expected at most {MAX_ENV} [NAME, value] pairs")
    out: dict[str, str] = {}
    for item in items:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise InvalidArgument(f"{where}: expected [NAME, value] pairs, got {item!r}")
        key, value = item
        if not isinstance(key, str) or key_re.fullmatch(key) is None:
            what = "a header name" if key_re is HEADER_RE else "an environment name"
            raise InvalidArgument(f"{where}: expected {what} {key_re.pattern}, got {key!r}")
        key_check(key)
        if key.lower() in {k.lower() for k in out}:
            raise InvalidArgument(f"{where}: {key} given twice")
        out[key] = check(key, value)
    return tuple(sorted(out.items()))


def _tools(raw: object) -> tuple[McpToolDef, ...]:
    where = "payload.server.tools"
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise InvalidArgument(f"{where}: expected a list of at most {MAX_TOOLS} tools")
    out: dict[str, McpToolDef] = {}
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InvalidArgument(f"{where}[{index}]: expected {{name, description, input_schema}}")
        only(item, "mcp", {"name", "description", "input_schema"})
        tool = tool_def(item.get("name"), item.get("description", ""), item.get("input_schema"))
        if tool.name in out:
            raise InvalidArgument(f"{where}: tool {tool.name} listed twice")
        out[tool.name] = tool
    return tuple(sorted(out.values(), key=lambda t: t.name))


def tool_def(name: object, description: object, schema: object) -> McpToolDef:
    """A tool definition as a server reported it, checked and with its schema canonical (the
    probe and the live client build the same value, so the digests compare)."""
    if not isinstance(name, str) or TOOL_RE.fullmatch(name) is None:
        raise InvalidArgument(f"MCP tool name: expected [A-Za-z0-9_.-]{{1,128}}, got {name!r}")
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
        raise InvalidArgument(f"MCP tool {name}: description over {MAX_DESCRIPTION} chars")
    text = schema if isinstance(schema, str) else canonical_schema(schema)
    if len(text) > MAX_SCHEMA:
        raise InvalidArgument(f"MCP tool {name}: input schema over {MAX_SCHEMA} chars")
    if isinstance(schema, str):
        text = canonical_schema(_json(schema, name))
    return McpToolDef(name=name, description=description, input_schema=text)


def _json(text: str, name: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        raise InvalidArgument(f"MCP tool {name}: input schema is not JSON") from None


def grantable(server: str, tool: str) -> bool:
    """Whether ``tool`` of ``server`` has a name a model can call (``mcp__<server>__<tool>``)."""
    return MODEL_NAME_RE.fullmatch(model_tool_name(server, tool)) is not None


KIND = McpKind()
