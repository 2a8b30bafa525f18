"""Skill values: an installed skill as the agent's definition holds it. Pure values (no I/O).

A skill is data, never code: UTF-8 text files in the Agent Skills layout (``SKILL.md`` with front
matter, then reference files), signed by a trusted key over a canonical manifest of its files.
The files' text is held here so that what a human approved is exactly what a session mounts
read-only at ``/skills/<name>``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ironclawd import lazy_re
from ironclawd.domain.egress import EgressRule
from ironclawd.domain.mcp import McpGrant

SKILL_NAME_RE = lazy_re.compile(r"[a-z0-9][a-z0-9-]{0,63}")


@dataclass(frozen=True)
class SkillFile:
    path: str  # relative, normalised, '/'-separated
    sha256: str  # hex digest of the file's bytes
    text: str  # the file's UTF-8 content


@dataclass(frozen=True)
class SkillGrants:
    """What installing the skill grants the agent besides its files, spelled out in the diff."""

    tools: tuple[str, ...] = ()  # names from the tool catalogue
    egress: tuple[EgressRule, ...] = ()
    # Tools of servers registered for the agent, pinned when the skill's change is applied.
    mcp_tools: tuple[McpGrant, ...] = ()


@dataclass(frozen=True)
class AgentSkill:
    name: str
    version: str
    description: str
    signer: str  # minisign key id (16 hex digits) of the trusted key that signed it
    manifest_sha256: str  # digest of the canonical manifest that was signed
    files: tuple[SkillFile, ...]
    grants: SkillGrants = SkillGrants()
