"""Agent definitions: what a session of an agent may use. Pure values.

The built-in ``demo`` agent (``BUILTIN``) needs no set-up on a fresh install; every other agent
comes from the configuration or from an approved ``create_agent`` change, held in the registry
(services/registry.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ironclawd import lazy_re
from ironclawd.domain.channels import Permissions, Route
from ironclawd.domain.egress import EgressRule
from ironclawd.domain.mcp import McpGrant, McpServer
from ironclawd.domain.packages import AgentPackage
from ironclawd.domain.providers import DEFAULT_PROVIDER
from ironclawd.domain.skills import AgentSkill
from ironclawd.errors import NotFound

MIB = 1024 * 1024
AGENT_NAME_RE = lazy_re.compile(r"[a-z][a-z0-9-]{0,62}")
# A granted host directory appears at /mnt/<name> inside the box (ironclawd/bundle/spec.py).
MOUNT_NAME_RE = lazy_re.compile(r"[a-z0-9-]{1,32}")
MAX_AGENT_MOUNTS = 8
# The agent's uid/gid inside the box, and on the host for files its gofer serves (runsc 20221219
# does not translate ids: ironclawd/bundle/spec.py). Not 65534, which host daemons share.
AGENT_UID = 10000
AGENT_GID = 10000


DEFAULT_PERSONA = (
    "You are the IronClaw demo agent. You run in a sandbox with no network. Answer briefly. "
    "Use your workspace tools when asked to keep notes."
)


@dataclass(frozen=True)
class AgentMount:
    """A host directory granted to an agent: ``source`` (resolved, under an operator allowlist,
    checked again at every session start) appears at ``/mnt/<name>``, read-only unless granted."""

    name: str
    source: str
    read_only: bool = True


@dataclass(frozen=True)
class AgentSpec:
    name: str
    persona: str = DEFAULT_PERSONA
    provider: str = DEFAULT_PROVIDER  # a name in PROVIDERS (ironclawd/domain/providers.py)
    model: str = "mock-1"
    base_url: str = ""
    credential: str = ""  # name of a host-held credential; never enters the sandbox
    tools: tuple[str, ...] = ("read_file", "write_file", "list_files", "request_change")
    max_tool_rounds: int = 8
    max_tokens: int = 1024
    requests_per_minute: int = 60
    tokens_per_day: int = 1_000_000
    session_requests_per_minute: int = 30
    session_tokens_per_day: int = 200_000
    memory_bytes: int = 256 * MIB
    tasks_max: int = 128
    cpu_percent: int = 100
    workspace_bytes: int = 32 * MIB
    uid: int = AGENT_UID
    gid: int = AGENT_GID
    egress: tuple[EgressRule, ...] = ()  # deny by default; rules only from approved changes
    mounts: tuple[AgentMount, ...] = ()  # none by default; only from approved changes
    skills: tuple[AgentSkill, ...] = ()  # installed skills (mounted at /skills/<name>)
    mcp_servers: tuple[McpServer, ...] = ()  # MCP servers registered for this agent
    mcp_grants: tuple[McpGrant, ...] = ()  # MCP tools granted, each pinned to its definition
    packages: tuple[AgentPackage, ...] = ()  # Debian packages in its image, dependencies included
    wiring: tuple[Route, ...] = ()  # which rooms and webhook endpoints reach it (none by default)
    permissions: Permissions = field(
        default_factory=Permissions
    )  # who may talk to it, who approves its changes


BUILTIN: dict[str, AgentSpec] = {"demo": AgentSpec("demo")}


def find_agent(catalog: Mapping[str, AgentSpec], name: str) -> AgentSpec:
    try:
        return catalog[name]
    except KeyError:
        known = ", ".join(sorted(catalog)) or "none"
        raise NotFound(f"agent '{name}' not found (known agents: {known})") from None


# What a session of the agent may use: its own grants plus those its installed skills brought
# (kept apart so that removing a skill takes away exactly what it granted). Every user of
# tools, egress rules or MCP grants reads these, never the fields alone.


def effective_tools(spec: AgentSpec) -> tuple[str, ...]:
    return tuple(dict.fromkeys([*spec.tools, *(t for s in spec.skills for t in s.grants.tools)]))


def effective_egress(spec: AgentSpec) -> tuple[EgressRule, ...]:
    return tuple(dict.fromkeys([*spec.egress, *(r for s in spec.skills for r in s.grants.egress)]))


def effective_mcp_grants(spec: AgentSpec) -> tuple[McpGrant, ...]:
    return tuple(
        dict.fromkeys([*spec.mcp_grants, *(g for s in spec.skills for g in s.grants.mcp_tools)])
    )


def own_credentials(spec: AgentSpec) -> frozenset[str]:
    """The names of the host-held credentials a session of the agent may cause to be used: its
    model key, those its egress rules inject (its skills' included) and those of its MCP
    servers. What returns to it is masked for these, and only these: masking every credential
    on the host told an agent which of its guesses was another agent's credential (its model
    repeats what it is asked to, and a guess came back ``[REDACTED]``)."""
    names = {spec.credential, *(rule.credential for rule in effective_egress(spec))}
    names.update(name for server in spec.mcp_servers for _, name in server.credentials)
    names.discard("")
    return frozenset(names)


def grant_overlap(
    agent: str, mounts: Iterable[AgentMount], agents: Mapping[str, AgentSpec]
) -> str | None:
    """Why ``agent``'s ``mounts`` may not be granted beside the other agents' grants, or None:
    a source strictly below a directory another agent may write, or a read-write source
    strictly above another agent's grant. The agent that can write the directory above can put
    a symlink in place of the one below between the check of its source (at every start) and
    runsc's mount of it, and so have the other agent's sandbox mount any host directory."""
    others = [(name, g) for name, spec in agents.items() if name != agent for g in spec.mounts]
    for mount in mounts:
        for name, granted in others:
            if not granted.read_only and mount.source.startswith(granted.source + "/"):
                return (
                    f"mount source {mount.source}: below {granted.source}, which agent "
                    f"'{name}' may write (it could put a symlink in its place); grant a "
                    "directory no agent may write above"
                )
            if not mount.read_only and granted.source.startswith(mount.source + "/"):
                return (
                    f"mount source {mount.source}: read-write above {granted.source}, granted "
                    f"to agent '{name}' (a symlink could be put in that one's place); grant it "
                    "read-only, or a directory beside it"
                )
    return None
