"""``skills``: install (``add``) or remove (``remove``) one signed skill of an agent.

``add`` carries the whole skill: every file's text and the ``SKILL.minisig`` text. Parsing
re-checks the format and recomputes hashes and manifest (ironclawd/formats/skill.py); the host
check verifies the signature against the operator's trusted keys, at submission and again at
apply. Applying installs the skill together with the grants its front matter asks for (tools,
egress rules, MCP tools pinned to the definitions the registered server offers), so approving
grants them all and rejecting grants none; removing a skill takes away exactly what it granted
(the agent's effective grants are its own plus its skills': domain/agents.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.egress import EgressRule, rule_from_mapping
from ironclawd.domain.kinds.base import ChangeKind, HostChecks, only
from ironclawd.domain.kinds.egress import rule_to_mapping
from ironclawd.domain.mcp import McpGrant
from ironclawd.domain.skills import SKILL_NAME_RE, AgentSkill, SkillFile, SkillGrants
from ironclawd.domain.tools import CATALOG
from ironclawd.errors import InvalidArgument, PolicyDenied
from ironclawd.formats import skill as skill_format

MAX_SKILLS = 16  # per agent


@dataclass(frozen=True)
class AddSkill:
    skill: skill_format.Skill  # its form checked; the signature is the host check
    egress: tuple[EgressRule, ...]  # the skill's egress rules, parsed


@dataclass(frozen=True)
class RemoveSkill:
    name: str


SkillOp = AddSkill | RemoveSkill


class SkillsKind(ChangeKind[SkillOp]):
    name = "skills"

    def parse(self, payload: Mapping[str, Any]) -> SkillOp:
        """``{"op": "add", "name", "files": [{"path", "text"}], "signature"}`` or
        ``{"op": "remove", "name"}``."""
        op = payload.get("op")
        if op == "remove":
            only(payload, self.name, {"op", "name"})
            return RemoveSkill(_name(payload.get("name")))
        if op != "add":
            raise InvalidArgument(f"payload.op: expected 'add' or 'remove', got {op!r}")
        only(payload, self.name, {"op", "name", "files", "signature"})
        name = _name(payload.get("name"))
        signature = payload.get("signature")
        if not isinstance(signature, str):
            raise InvalidArgument("payload.signature: expected the SKILL.minisig text")
        skill = skill_format.load(name, _files(payload.get("files")), signature)
        unknown = [t for t in skill.tools if t not in CATALOG]
        if unknown:
            raise InvalidArgument(
                f"skill {name}: ironclaw.tools: unknown tool(s) "
                f"{', '.join(unknown)} (known: {', '.join(sorted(CATALOG))})"
            )
        rules = []
        for index, raw in enumerate(skill.egress):
            try:
                rules.append(rule_from_mapping(dict(raw)))
            except (ValueError, TypeError) as exc:
                raise InvalidArgument(
                    f"skill {name}: ironclaw.egress[{index}]: expected {exc}"
                ) from None
        return AddSkill(skill, tuple(dict.fromkeys(rules)))

    def dump(self, payload: SkillOp) -> dict[str, Any]:
        if isinstance(payload, RemoveSkill):
            return {"op": "remove", "name": payload.name}
        skill = payload.skill
        return {
            "op": "add",
            "name": skill.name,
            "files": [{"path": f.path, "text": f.text} for f in skill.files],
            "signature": skill.signature,
        }

    def apply(self, spec: AgentSpec, payload: SkillOp) -> AgentSpec:
        installed = [s.name for s in spec.skills]
        if isinstance(payload, RemoveSkill):
            if payload.name not in installed:
                raise InvalidArgument(
                    f"agent '{spec.name}' has no skill '{payload.name}' "
                    f"(installed: {', '.join(installed) or 'none'})"
                )
            kept = tuple(s for s in spec.skills if s.name != payload.name)
            return dataclasses.replace(spec, skills=kept)
        new = _installed(spec, payload)
        if new.name in installed:
            skills = tuple(new if s.name == new.name else s for s in spec.skills)
        elif len(spec.skills) >= MAX_SKILLS:
            raise InvalidArgument(
                f"agent '{spec.name}' has {MAX_SKILLS} skills, the most it may "
                "have; remove one first"
            )
        else:
            skills = (*spec.skills, new)
        return dataclasses.replace(spec, skills=skills)

    def view(self, spec: AgentSpec) -> dict[str, Any]:
        # One entry for the skill and one for what it grants, per skill, so that the diff of an
        # install shows its grants on a line of their own. Absent when there are no skills:
        # changes submitted before skills existed keep their `before`.
        out: dict[str, Any] = {}
        for s in spec.skills:
            out[f"skills.{s.name}"] = {
                "version": s.version,
                "description": s.description,
                "signer": s.signer,
                "manifest_sha256": s.manifest_sha256,
                "files": [
                    {"path": f.path, "sha256": f.sha256, "size": len(f.text.encode())}
                    for f in s.files
                ],
            }
            out[f"skills.{s.name}.grants"] = {
                "tools": list(s.grants.tools),
                "egress": [_shown(r) for r in s.grants.egress],
                "mcp_tools": [dataclasses.asdict(g) for g in s.grants.mcp_tools],
            }
        return out

    def authorize(self, payload: SkillOp, submitter: str) -> None:
        # A credential injected towards a host a skill names is a key-exfiltration request: no
        # skill may carry one, whoever submits it (the format refuses one already).
        if isinstance(payload, AddSkill) and any(r.credential for r in payload.egress):
            raise PolicyDenied(
                f"skill {payload.skill.name}: an egress rule with a credential; "
                "a skill can never carry one"
            )

    def host_check(self, payload: SkillOp, host: HostChecks) -> None:
        if isinstance(payload, AddSkill):
            skill = payload.skill
            host.skill_signature(skill.name, skill.manifest, skill.signature)


def _shown(rule: EgressRule) -> dict[str, Any]:
    # Without the credential fields: a skill never carries one (parse and authorize refuse it).
    return {k: v for k, v in rule_to_mapping(rule).items() if not k.startswith("credential")}


def _name(raw: object) -> str:
    if not isinstance(raw, str) or SKILL_NAME_RE.fullmatch(raw) is None:
        raise InvalidArgument(f"payload.name: expected [a-z0-9][a-z0-9-]{{0,63}}, got {raw!r}")
    return raw


def _files(raw: object) -> dict[str, bytes]:
    if not isinstance(raw, list) or len(raw) > skill_format.MAX_FILES:
        raise InvalidArgument(
            f"payload.files: expected a list of at most {skill_format.MAX_FILES} {{path, text}}"
        )
    out: dict[str, bytes] = {}
    for index, item in enumerate(raw):
        where = f"payload.files[{index}]"
        if not isinstance(item, dict):
            raise InvalidArgument(f"{where}: expected an object with path and text")
        only(item, "skills", {"path", "text"})
        path, text = item.get("path"), item.get("text")
        if not isinstance(path, str) or not isinstance(text, str):
            raise InvalidArgument(f"{where}: expected text path and text")
        if path in out:
            raise InvalidArgument(f"{where}: {path!r} given twice")
        try:
            out[path] = text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"{where}: {path!r}: not valid UTF-8 text") from None
    return out


def _installed(spec: AgentSpec, payload: AddSkill) -> AgentSkill:
    skill = payload.skill
    return AgentSkill(
        name=skill.name,
        version=skill.version,
        description=skill.description,
        signer=skill.signer,
        manifest_sha256=skill.manifest_sha256,
        files=tuple(SkillFile(f.path, f.sha256, f.text) for f in skill.files),
        grants=SkillGrants(
            tools=skill.tools,
            egress=payload.egress,
            mcp_tools=tuple(_pin(spec, skill.name, s, t) for s, t in skill.mcp_tools),
        ),
    )


def _pin(spec: AgentSpec, skill: str, server_name: str, tool: str) -> McpGrant:
    """The grant of ``server_name/tool`` pinned to the definition its registration recorded."""
    server = next((s for s in spec.mcp_servers if s.name == server_name), None)
    if server is None:
        known = ", ".join(s.name for s in spec.mcp_servers) or "none"
        raise InvalidArgument(
            f"skill {skill}: asks for MCP tool {server_name}/{tool}, but no "
            f"server '{server_name}' is registered for agent '{spec.name}' "
            f"(registered: {known}; register it with an mcp change first)"
        )
    found = next((d for d in server.tools if d.name == tool), None)
    if found is None:
        known = ", ".join(d.name for d in server.tools) or "none"
        raise InvalidArgument(
            f"skill {skill}: asks for MCP tool {server_name}/{tool}, which "
            f"server '{server_name}' does not offer (its tools: {known})"
        )
    return McpGrant(server_name, tool, found.digest)


KIND = SkillsKind()
