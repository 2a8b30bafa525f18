"""What an agent's MCP grants come to (docs/mcp.md, "In the sandbox"): each granted tool with
the definition pinned when a human approved it, and the tool definitions the model is offered.
Pure: the live definitions are compared by services/mcp_gateway.py.

A grant records only the digest of the definition it approved; the definition itself is the
one in the registered server's ``tools`` with that name and digest. A grant whose definition is
not there (nothing approved it) offers the model nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ironclawd.domain.agents import AgentSpec, effective_mcp_grants
from ironclawd.domain.mcp import McpGrant, McpServer, McpToolDef
from ironclawd.domain.model import ToolDef


@dataclass(frozen=True)
class PinnedTool:
    """A granted tool and the definition pinned at approval."""

    grant: McpGrant
    definition: McpToolDef

    @property
    def model_name(self) -> str:
        return self.grant.model_name


def find_server(spec: AgentSpec, name: str) -> McpServer | None:
    """The server registered for the agent under ``name``, or None."""
    return next((s for s in spec.mcp_servers if s.name == name), None)


def pinned_definition(server: McpServer, grant: McpGrant) -> McpToolDef | None:
    """The definition ``grant`` approved, as the server's registration records it, or None."""
    return next(
        (t for t in server.tools if t.name == grant.tool and t.digest == grant.digest), None
    )


def grants_for(spec: AgentSpec, server: str, tool: str) -> tuple[McpGrant, ...]:
    """The agent's current grants of one tool (its own and its skills'; normally one)."""
    return tuple(g for g in effective_mcp_grants(spec) if (g.server, g.tool) == (server, tool))


def pinned_tools(spec: AgentSpec) -> tuple[PinnedTool, ...]:
    """Every granted tool of a registered server with its pinned definition, one per model
    name (a tool granted twice with different pins is offered with the first one found)."""
    out: dict[str, PinnedTool] = {}
    for grant in effective_mcp_grants(spec):
        server = find_server(spec, grant.server)
        definition = pinned_definition(server, grant) if server is not None else None
        if definition is not None and grant.model_name not in out:
            out[grant.model_name] = PinnedTool(grant, definition)
    return tuple(out.values())


def mcp_tool_defs(spec: AgentSpec) -> tuple[ToolDef, ...]:
    """The granted MCP tools as the model is offered them: namespaced, pinned definitions."""
    return tuple(
        ToolDef(
            p.model_name,
            p.definition.description or f"Tool {p.grant.tool} of MCP server {p.grant.server}.",
            p.definition.input_schema,
        )
        for p in pinned_tools(spec)
    )
