"""Capability changes held for a human decision (docs/architecture.md §7). Pure values and rules.

A change names its kind, target agent and a typed payload; at submission the host records the
agent's configuration before and after, and a canonical hash of exactly what would be applied.
An approval must name that hash; applying checks the agent still looks like ``before``.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import hashlib
import json
import posixpath
from dataclasses import dataclass
from typing import Any

from ironclawd.domain.agents import (
    AGENT_NAME_RE,
    MAX_AGENT_MOUNTS,
    MOUNT_NAME_RE,
    AgentMount,
    AgentSpec,
)
from ironclawd.domain.egress import EgressRule, rule_from_mapping
from ironclawd.domain.tools import CATALOG
from ironclawd.errors import Conflict, InvalidArgument

KINDS = (
    "persona", "tools", "packages", "wiring", "permissions", "mounts", "egress", "skills", "mcp",
    "create_agent",
)  # fmt: skip
# Kinds this version can apply. The others are validated and refused with a clear reason by
# the verifiers rather than accepted and left to rot.
APPLIABLE = frozenset({"persona", "tools", "egress", "mounts", "create_agent"})
# Why a kind is not appliable, when there is more to say than "not yet".
NOT_APPLIABLE_WHY = {
    "packages": (
        "packages are not installed into agent images yet; the design (host-side apt download "
        "and signature check, unpacked into a per-agent read-only layer) is in docs/packages.md"
    ),
}
MAX_EGRESS_RULES = 64
MAX_PERSONA = 16_000


class ChangeState(enum.Enum):
    PENDING = "pending"
    APPROVED = "approved"
    APPLIED = "applied"
    REJECTED = "rejected"
    EXPIRED = "expired"
    FAILED = "failed"


TRANSITIONS = {
    ChangeState.PENDING: {ChangeState.APPROVED, ChangeState.REJECTED, ChangeState.EXPIRED},
    ChangeState.APPROVED: {ChangeState.APPLIED, ChangeState.FAILED},
}


@dataclass(frozen=True)
class Change:
    id: str
    kind: str
    agent: str
    payload: str  # canonical JSON
    reason: str
    submitter: str  # "uid:1000(alice)" or "session:<sid>"
    before: str  # canonical JSON of the agent's view ("null" for create_agent)
    after: str
    hash: str
    created_at: float
    expires_at: float
    state: ChangeState = ChangeState.PENDING
    decided_by: str = ""
    decided_at: float = 0.0
    note: str = ""


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def agent_view(spec: AgentSpec | None) -> dict[str, Any] | None:
    """The parts of an agent a change can touch (what the approver sees diffed)."""
    if spec is None:
        return None
    view: dict[str, Any] = {
        "name": spec.name,
        "persona": spec.persona,
        "provider": spec.provider,
        "model": spec.model,
        "tools": list(spec.tools),
        "egress": [rule_to_mapping(r) for r in spec.egress],
    }
    # Only when there are any: changes submitted before mounts existed keep their `before`.
    if spec.mounts:
        view["mounts"] = [dataclasses.asdict(m) for m in spec.mounts]
    return view


def _text(payload: dict[str, Any], key: str, limit: int) -> str:
    value = payload.get(key)
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise InvalidArgument(f"payload.{key}: expected non-empty text of at most {limit} chars")
    return value


def _only(payload: dict[str, Any], kind: str, allowed: set[str]) -> None:
    extra = sorted(set(payload) - allowed)
    if extra:
        raise InvalidArgument(
            f"payload for {kind}: unexpected key(s) {', '.join(extra)} "
            f"(expected: {', '.join(sorted(allowed))})"
        )


def _tool_list(payload: dict[str, Any]) -> tuple[str, ...]:
    tools = payload.get("tools")
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise InvalidArgument("payload.tools: expected a list of tool names")
    unknown = [t for t in tools if t not in CATALOG]
    if unknown:
        raise InvalidArgument(
            f"payload.tools: unknown tool(s) {', '.join(unknown)} "
            f"(known: {', '.join(sorted(CATALOG))})"
        )
    return tuple(dict.fromkeys(tools))


def _egress_rules(payload: dict[str, Any]) -> list[EgressRule]:
    """Egress rule sanity: every rule parses (scheme, host, port, methods, path prefixes); the
    list replaces the agent's grants as a whole (an empty list revokes them all)."""
    rules = payload.get("rules")
    if not isinstance(rules, list) or len(rules) > MAX_EGRESS_RULES:
        raise InvalidArgument(f"payload.rules: expected a list of at most {MAX_EGRESS_RULES} rules")
    parsed = []
    for index, raw in enumerate(rules):
        try:
            parsed.append(rule_from_mapping(raw))
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(f"payload.rules[{index}]: expected {exc}") from None
    return parsed


def _mount_list(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Mount syntax: at most MAX_AGENT_MOUNTS of {source, name, read_only}; names unique and
    [a-z0-9-]{1,32}; sources absolute and normalised (no '..'), none inside another. Whether a
    source is a real directory under the operator's allowlist is the gateway's check (host I/O),
    repeated at every session start. The list replaces the agent's mounts as a whole."""
    mounts = payload.get("mounts")
    if not isinstance(mounts, list) or len(mounts) > MAX_AGENT_MOUNTS:
        raise InvalidArgument(
            f"payload.mounts: expected a list of at most {MAX_AGENT_MOUNTS} mounts"
        )
    out: list[dict[str, Any]] = []
    for index, raw in enumerate(mounts):
        where = f"payload.mounts[{index}]"
        if not isinstance(raw, dict):
            raise InvalidArgument(f"{where}: expected an object with source, name, read_only")
        _only(raw, "mounts", {"source", "name", "read_only"})
        name, source, read_only = raw.get("name"), raw.get("source"), raw.get("read_only", True)
        if not isinstance(name, str) or MOUNT_NAME_RE.fullmatch(name) is None:
            raise InvalidArgument(f"{where}.name: expected [a-z0-9-]{{1,32}}, got {name!r}")
        if (
            not isinstance(source, str)
            or not source.startswith("/")
            or source.startswith("//")
            or "\0" in source
            or posixpath.normpath(source) != source
            or source == "/"
        ):
            raise InvalidArgument(
                f"{where}.source: expected an absolute, normalised directory path below / "
                f"(no '..', '//', trailing '/'), got {source!r}"
            )
        if not isinstance(read_only, bool):
            raise InvalidArgument(f"{where}.read_only: expected true or false")
        out.append({"name": name, "source": source, "read_only": read_only})
    names = [m["name"] for m in out]
    if len(set(names)) != len(names):
        raise InvalidArgument("payload.mounts: expected each name once")
    for a in out:
        for b in out:
            if a is not b and (
                a["source"] == b["source"] or b["source"].startswith(a["source"] + "/")
            ):
                raise InvalidArgument(
                    f"payload.mounts: {b['source']} overlaps {a['source']}; grant one of them"
                )
    return out


def rule_to_mapping(rule: EgressRule) -> dict[str, Any]:
    out = dataclasses.asdict(rule)
    out["methods"] = list(rule.methods)
    out["path_prefixes"] = list(rule.path_prefixes)
    return out


def check_payload(kind: str, agent: str, payload_json: str) -> dict[str, Any]:
    """Schema verifier: the payload parsed, typed and normalized, or InvalidArgument."""
    if kind not in KINDS:
        raise InvalidArgument(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    if not AGENT_NAME_RE.fullmatch(agent):
        raise InvalidArgument(f"agent: expected a name of [a-z][a-z0-9-]{{0,62}}, got {agent!r}")
    try:
        payload = json.loads(payload_json)
    except ValueError as exc:
        raise InvalidArgument(f"payload: not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidArgument("payload: expected a JSON object")
    if kind not in APPLIABLE:
        why = NOT_APPLIABLE_WHY.get(kind, "")
        raise InvalidArgument(
            f"kind {kind}: this ironclawd cannot apply {kind} changes yet; nothing was queued"
            + (f" ({why})" if why else "")
        )
    if kind == "persona":
        _only(payload, kind, {"persona"})
        return {"persona": _text(payload, "persona", MAX_PERSONA)}
    if kind == "tools":
        _only(payload, kind, {"tools"})
        return {"tools": list(_tool_list(payload))}
    if kind == "egress":
        _only(payload, kind, {"rules"})
        return {"rules": [rule_to_mapping(r) for r in _egress_rules(payload)]}
    if kind == "mounts":
        _only(payload, kind, {"mounts"})
        return {"mounts": _mount_list(payload)}
    _only(payload, kind, {"persona", "tools", "provider", "model"})
    out: dict[str, Any] = {"persona": _text(payload, "persona", MAX_PERSONA)}
    out["tools"] = list(_tool_list(payload)) if "tools" in payload else []
    provider = payload.get("provider", "mock")
    if provider not in ("mock", "anthropic", "openai"):
        raise InvalidArgument("payload.provider: expected mock, anthropic or openai")
    out["provider"] = provider
    out["model"] = _text(payload, "model", 200) if "model" in payload else "mock-1"
    return out


def apply_payload(
    kind: str, agent: str, spec: AgentSpec | None, payload: dict[str, Any]
) -> AgentSpec:
    """The agent as it would be after the change (pure)."""
    if kind == "create_agent":
        if spec is not None:
            raise Conflict(f"agent '{agent}' already exists")
        return AgentSpec(
            name=agent,
            persona=payload["persona"],
            tools=tuple(payload["tools"]),
            provider=payload["provider"],
            model=payload["model"],
        )
    if spec is None:
        raise Conflict(f"agent '{agent}' does not exist (submit a create_agent change first)")
    if kind == "persona":
        return dataclasses.replace(spec, persona=payload["persona"])
    if kind == "tools":
        return dataclasses.replace(spec, tools=tuple(payload["tools"]))
    if kind == "egress":
        rules = tuple(rule_from_mapping(r) for r in payload["rules"])
        return dataclasses.replace(spec, egress=rules)
    if kind == "mounts":
        mounts = tuple(AgentMount(**m) for m in payload["mounts"])
        return dataclasses.replace(spec, mounts=mounts)
    raise InvalidArgument(f"kind {kind}: no applier")


def change_hash(kind: str, agent: str, payload: str, before: str) -> str:
    """sha256 over exactly what would be applied, and to what."""
    material = canonical({"kind": kind, "agent": agent, "payload": payload, "before": before})
    return hashlib.sha256(material.encode()).hexdigest()


def transition(change: Change, to: ChangeState, **fields: Any) -> Change:
    if to not in TRANSITIONS.get(change.state, set()):
        raise Conflict(f"change {change.id} is {change.state.value}: cannot become {to.value}")
    return dataclasses.replace(change, state=to, **fields)


def diff_lines(before: str, after: str) -> list[str]:
    """A unified diff of the agent's view, one field per line, strings JSON-escaped so control
    and bidi characters are visible as escapes."""

    def lines(text: str) -> list[str]:
        value = json.loads(text)
        if value is None:
            return []
        return [f"{k}: {json.dumps(v, ensure_ascii=True)}" for k, v in sorted(value.items())]

    return list(difflib.unified_diff(lines(before), lines(after), "before", "after", lineterm=""))
