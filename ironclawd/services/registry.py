"""The agent registry in the state DB: a read-only Mapping for the rest of the daemon. It
changes only through the approval gateway (services/gateway.py)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ironclawd.domain.agents import AgentMount, AgentSpec
from ironclawd.domain.channels import Permissions, Route
from ironclawd.domain.egress import rule_from_mapping
from ironclawd.domain.mcp import McpGrant, McpServer, McpToolDef
from ironclawd.domain.packages import AgentPackage
from ironclawd.domain.skills import AgentSkill, SkillFile, SkillGrants
from ironclawd.errors import HostError
from ironclawd.ports import AgentRecords, Clock


def spec_to_json(spec: AgentSpec) -> str:
    return json.dumps(dataclasses.asdict(spec), sort_keys=True)


def spec_from_json(text: str) -> AgentSpec:
    """An agent as stored. A record holding what this version does not know (fields a newer
    ironclawd added, then a downgrade) is refused, naming them: read without them it would be
    misread (a newer restriction ignored), and written back without them, lost for good."""
    raw: dict[str, Any] = json.loads(text)
    name = raw.get("name") if isinstance(raw, dict) else None
    try:
        spec = _spec(raw)
    except (TypeError, KeyError, AttributeError, ValueError) as exc:
        raise HostError(
            f"agent {name!r} in the registry: a record this ironclawd cannot read ({exc}); "
            "written by another version?"
        ) from None
    unknown = _unknown(raw, json.loads(spec_to_json(spec)), "")
    if unknown:
        raise HostError(
            f"agent {name!r} in the registry: {', '.join(unknown[:5])} not known to this "
            "ironclawd (written by a newer version?): refusing to read it without them"
        )
    return spec


def _unknown(stored: object, read: object, where: str) -> list[str]:
    """Where ``stored`` (a record as stored) holds what ``read`` (it read back, written again)
    lacks or holds otherwise. Keys only ``read`` has are fields older records predate."""
    if isinstance(stored, dict) and isinstance(read, dict):
        lost: list[str] = []
        for key, value in stored.items():
            at = f"{where}.{key}" if where else str(key)
            lost += _unknown(value, read[key], at) if key in read else [at]
        return lost
    if isinstance(stored, list) and isinstance(read, list) and len(stored) == len(read):
        return [
            at for i, item in enumerate(stored) for at in _unknown(item, read[i], f"{where}[{i}]")
        ]
    return [] if stored == read else [where or "the record"]


def _spec(raw: dict[str, Any]) -> AgentSpec:
    known = {f.name for f in dataclasses.fields(AgentSpec)}
    values: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known
    }
    # Egress rules are stored as tables; back to checked values (a bad one fails loudly).
    values["egress"] = tuple(rule_from_mapping(r) for r in raw.get("egress", ()))
    values["mounts"] = tuple(AgentMount(**m) for m in raw.get("mounts", ()))
    values["skills"] = tuple(_skill(s) for s in raw.get("skills", ()))
    values["mcp_servers"] = tuple(_server(s) for s in raw.get("mcp_servers", ()))
    values["mcp_grants"] = tuple(McpGrant(**g) for g in raw.get("mcp_grants", ()))
    values["packages"] = tuple(AgentPackage(**p) for p in raw.get("packages", ()))
    values["wiring"] = tuple(Route(**r) for r in raw.get("wiring", ()))
    values["permissions"] = _permissions(raw.get("permissions", {}))
    return AgentSpec(**values)


def _skill(raw: dict[str, Any]) -> AgentSkill:
    grants = raw.get("grants", {})
    return AgentSkill(
        name=raw["name"], version=raw["version"], description=raw["description"],
        signer=raw["signer"], manifest_sha256=raw["manifest_sha256"],
        files=tuple(SkillFile(**f) for f in raw["files"]),
        grants=SkillGrants(
            tools=tuple(grants.get("tools", ())),
            egress=tuple(rule_from_mapping(r) for r in grants.get("egress", ())),
            mcp_tools=tuple(McpGrant(**g) for g in grants.get("mcp_tools", ())),
        ),
    )  # fmt: skip


def _permissions(raw: dict[str, Any]) -> Permissions:
    return Permissions(
        allow=tuple(raw.get("allow", ())), unknown=raw.get("unknown", "drop"),
        approvers=tuple((k, g) for k, g in raw.get("approvers", ())),
    )  # fmt: skip


def _server(raw: dict[str, Any]) -> McpServer:
    return McpServer(
        name=raw["name"], command=tuple(raw.get("command", ())), url=raw.get("url", ""),
        env=tuple((k, v) for k, v in raw.get("env", ())),
        credentials=tuple((k, v) for k, v in raw.get("credentials", ())),
        allow=tuple(raw.get("allow", ())),
        tools=tuple(McpToolDef(**t) for t in raw.get("tools", ())),
    )  # fmt: skip


class Registry(Mapping[str, AgentSpec]):
    def __init__(self, store: AgentRecords, seed: Iterable[AgentSpec], clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._cache = {name: spec_from_json(text) for name, text in store.agents().items()}
        for spec in seed:
            # A fresh install gets the built-in demo agent (and the config's agents) once;
            # afterwards the registry is the source of truth.
            if spec.name not in self._cache:
                self.put(spec)

    def put(self, spec: AgentSpec) -> None:
        """Only the gateway's appliers (and first-start seeding) call this."""
        self._store.put_agent(spec.name, spec_to_json(spec), self._clock.time())
        self._cache[spec.name] = spec

    def __getitem__(self, name: str) -> AgentSpec:
        return self._cache[name]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._cache))

    def __len__(self) -> int:
        return len(self._cache)
