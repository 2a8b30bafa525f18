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
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ironclawd.domain.agents import (
    AGENT_NAME_RE,
    AgentSpec,
    effective_egress,
    effective_mcp_grants,
    effective_tools,
)
from ironclawd.domain.kinds import KINDS, ChangeKind, HostChecks
from ironclawd.domain.kinds.egress import MAX_EGRESS_RULES, rule_to_mapping
from ironclawd.domain.kinds.persona import MAX_PERSONA
from ironclawd.errors import Conflict, InvalidArgument

__all__ = [
    "APPLIABLE", "KINDS", "MAX_EGRESS_RULES", "MAX_PERSONA", "Change", "ChangeState",
    "HostChecks", "ParsedChange", "agent_view", "apply_payload", "canonical", "change_hash",
    "check_payload", "diff_lines", "parse_change", "rule_to_mapping", "transition",
]  # fmt: skip

# Kinds this version can apply (the others are refused with their reason: kinds/base.py).
APPLIABLE = frozenset(name for name, kind in KINDS.items() if not kind.refusal)
P = TypeVar("P")


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
    # For a change a session submitted: the host users who had sent that session messages
    # ("uid:N(name)"). Under four-eyes none of them may approve it: they could have asked for it.
    drivers: tuple[str, ...] = ()


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def agent_view(spec: AgentSpec | None) -> dict[str, Any] | None:
    """The parts of an agent a change can touch (what the approver sees diffed): the fields
    every kind shows of it."""
    if spec is None:
        return None
    view: dict[str, Any] = {}
    for kind in KINDS.values():
        view.update(kind.view(spec))
    return view


@dataclass(frozen=True)
class ParsedChange(Generic[P]):
    """A change's payload parsed by its kind: what the gateway verifies and applies."""

    kind: ChangeKind[P]
    agent: str
    payload: P

    def to_json(self) -> dict[str, Any]:
        """The canonical JSON form, as stored and hashed."""
        return self.kind.dump(self.payload)

    def apply(self, current: AgentSpec | None) -> AgentSpec:
        """The agent as it would be after the change (pure)."""
        _check_target(self.kind, self.agent, current)
        if current is None:
            return self.kind.apply(AgentSpec(name=self.agent), self.payload)
        return self.kind.apply(current, self.payload)

    def authorize(self, submitter: str) -> None:
        self.kind.authorize(self.payload, submitter)

    def host_check(self, host: HostChecks) -> None:
        self.kind.host_check_for(self.agent, self.payload, host)

    def resolved(self, host: HostChecks) -> ParsedChange[P]:
        """At submission: the change with what the host decides filled in (kinds' ``resolve``)."""
        return ParsedChange(self.kind, self.agent, self.kind.resolve(self.payload, host))

    def prepare(self, host: HostChecks) -> None:
        """At apply, before the agent changes: the host work the new spec needs."""
        self.kind.prepare(self.payload, host)


# What a change of another kind can also grant or take away, and how to see it: a skill brings
# tools, egress rules and MCP grants; a new agent its tools. The rules keyed by kind (four-eyes,
# an agent's approver groups) hold for every kind whose effect a change has, not only its own.
_EFFECTS: dict[str, Callable[[AgentSpec], object]] = {
    "tools": effective_tools,
    # A webhook route's reply_url sends the agent's replies to a host: a way out, decided under
    # the egress rules too (found by a review: a session's wiring change passed the agent's
    # egress approver group).
    "egress": lambda spec: (effective_egress(spec), {r.reply_url for r in spec.wiring}),
    "mcp": lambda spec: (effective_mcp_grants(spec), spec.mcp_servers),
}


def effect_kinds(
    kind: str, before: AgentSpec | None, after: AgentSpec, *, groups: bool = True
) -> frozenset[str]:
    """The kinds a change of ``kind`` taking the agent from ``before`` (None: it creates the
    agent) to ``after`` amounts to: its own, each kind whose effective grants differ (a skill
    carrying an egress rule is an egress change too) and, with ``groups``, each kind whose
    approver group differs."""
    base = before if before is not None else AgentSpec(name=after.name)
    found = {kind}
    found.update(name for name, of in _EFFECTS.items() if of(base) != of(after))
    # A change of who decides a kind is a change of that kind: else any admin could lift the
    # egress group's rule with a permissions change, then approve egress himself (found by a
    # review).
    if groups:  # False for a rejection: keeping a rule as it is lifts nothing
        found.update(regrouped(base, after))
    return frozenset(found)


def regrouped(before: AgentSpec, after: AgentSpec) -> frozenset[str]:
    """The kinds whose approver group (permissions' ``approvers``) differs between the two."""
    old, new = dict(before.permissions.approvers), dict(after.permissions.approvers)
    return frozenset(k for k in {*old, *new} if old.get(k) != new.get(k))


def _kind(name: str) -> ChangeKind[Any]:
    kind = KINDS.get(name)
    if kind is None:
        raise InvalidArgument(f"kind: expected one of {', '.join(KINDS)}, got {name!r}")
    return kind


def _check_target(kind: ChangeKind[Any], agent: str, current: AgentSpec | None) -> None:
    if kind.creates_agent and current is not None:
        raise Conflict(f"agent '{agent}' already exists")
    if not kind.creates_agent and current is None:
        raise Conflict(f"agent '{agent}' does not exist (submit a create_agent change first)")


def parse_change(kind_name: str, agent: str, payload_json: str) -> ParsedChange[Any]:
    """Schema verifier: the kind known and appliable, the agent's name well-formed, the payload
    a JSON object its kind parses; else InvalidArgument naming the field."""
    kind = _kind(kind_name)
    if not AGENT_NAME_RE.fullmatch(agent):
        raise InvalidArgument(f"agent: expected a name of [a-z][a-z0-9-]{{0,62}}, got {agent!r}")
    try:
        payload = json.loads(payload_json)
        # A lone surrogate (JSON's "\ud800") cannot be hashed or stored as UTF-8.
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        # Not a ValueError: it escaped as an internal error, unaudited (found by a review).
        raise InvalidArgument("payload: nested too deeply") from None
    except UnicodeEncodeError as exc:
        raise InvalidArgument(
            f"payload: holds a lone surrogate ({exc.object[exc.start]!a}); expected text"
        ) from None
    except ValueError as exc:
        raise InvalidArgument(f"payload: not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidArgument("payload: expected a JSON object")
    if kind.refusal:
        raise InvalidArgument(kind.refusal)
    try:
        parsed = kind.parse(payload)
    except RecursionError:
        raise InvalidArgument("payload: nested too deeply") from None
    return ParsedChange(kind, agent, parsed)


def check_payload(kind: str, agent: str, payload_json: str) -> dict[str, Any]:
    """The payload parsed, typed and normalized, in its canonical JSON form."""
    return parse_change(kind, agent, payload_json).to_json()


def apply_payload(
    kind: str, agent: str, spec: AgentSpec | None, payload: Mapping[str, Any]
) -> AgentSpec:
    """The agent as it would be after a change given in its JSON form (pure)."""
    kind_ = _kind(kind)
    _check_target(kind_, agent, spec)
    return ParsedChange(kind_, agent, kind_.parse(payload)).apply(spec)


def change_hash(kind: str, agent: str, payload: str, before: str) -> str:
    """sha256 over exactly what would be applied, and to what."""
    material = canonical({"kind": kind, "agent": agent, "payload": payload, "before": before})
    return hashlib.sha256(material.encode()).hexdigest()


# The most a change's canonical payload may take (UTF-8). The largest legitimate payload is a
# skill's: files of up to 1 MiB in all (formats/skill.py MAX_TOTAL_BYTES, docs/skills.md), which
# JSON can double (a newline or a quote is two characters), 64 paths and a signature of at most
# 9 KiB: about 2 MiB and 40 KiB.
MAX_PAYLOAD_BYTES = 5 * 512 * 1024  # 2.5 MiB
# The most a change may take as the admin API shows it (payload, the agent's view before and
# after, their diff, the reason), under the admin socket's 4 MiB answer: the payload alone does
# not bound it, an egress change shows its rules three times. A 1.4 MB egress change made every
# `ironctl change list` fail (found by a review).
MAX_SHOWN_BYTES = 3 * 1024 * 1024
# The most an agent's view (``agent_view``, canonical JSON) may grow to. Unbounded, a view grown
# past ~1.5 MiB by changes each under the caps above made every later change of the agent,
# a removal too, larger than MAX_SHOWN_BYTES: nobody could change the agent again (found by a
# review). A change shows its payload, the view before and after and their diff, whose lines
# are ASCII (``_escaped``: a two-byte character takes six there): the view is measured so
# (``escaped_bytes``), and with views of at most this a change that shrinks the view shows in
# about 2 MiB and its payload. Measured in UTF-8, a view of ~470 KiB of accented text passed,
# and shortening its MCP server's definitions showed as 4.3 MB and was refused (found by a
# review). Tool definitions past this would fill a model's context window anyway (they go
# with every model call).
MAX_VIEW_BYTES = 512 * 1024
_BMP = re.compile("[\x80-\uffff]")
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


def escaped_bytes(text: str) -> int:
    """The length of JSON ``text`` with every non-ASCII character escaped, as the diff shows
    it: ``\\uXXXX`` (6 bytes), a pair of them beyond the BMP."""
    return len(text) + 5 * len(_BMP.findall(text)) + 11 * len(_ASTRAL.findall(text))


def check_size(payload: str, before: str, after: str, reason: str) -> None:
    """At submission: InvalidArgument, naming the size and the cap, unless the canonical
    ``payload`` is at most MAX_PAYLOAD_BYTES, the agent's view ``after`` at most MAX_VIEW_BYTES
    as the diff shows it (``escaped_bytes``; or no larger than ``before``) and the change, as
    shown, at most MAX_SHOWN_BYTES."""
    size = len(payload.encode("utf-8", "surrogatepass"))
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidArgument(
            f"payload: {size} bytes as canonical JSON; expected at most {MAX_PAYLOAD_BYTES}"
        )
    grown, was = (escaped_bytes(view) for view in (after, before))
    if grown > MAX_VIEW_BYTES and grown > was:
        raise InvalidArgument(
            f"change: the agent would take {grown} bytes as the approver sees it (JSON, "
            "characters past ASCII escaped as \\uXXXX; persona, "
            f"tools, MCP servers and their tool definitions, skills, rules, ...); expected at "
            f"most {MAX_VIEW_BYTES}: take something away first (this bound never refuses a "
            "change that makes the agent smaller)"
        )
    shown = shown_bytes(payload, before, after, reason)
    if shown > MAX_SHOWN_BYTES:
        raise InvalidArgument(
            f"change: {shown} bytes as shown (payload, the agent before and after, their diff); "
            f"expected at most {MAX_SHOWN_BYTES}"
        )


def shown_bytes(payload: str, before: str, after: str, reason: str) -> int:
    """At least what a change of these takes in an answer of the admin API (protobuf): each text
    in UTF-8 with up to 6 bytes of framing, 1 KiB for the short fields (ids, times, state)."""
    texts = [payload, before, after, reason, *diff_lines(before, after)]
    return 1024 + sum(len(t.encode("utf-8", "surrogatepass")) + 6 for t in texts)


def transition(change: Change, to: ChangeState, **fields: Any) -> Change:
    if to not in TRANSITIONS.get(change.state, set()):
        raise Conflict(f"change {change.id} is {change.state.value}: cannot become {to.value}")
    return dataclasses.replace(change, state=to, **fields)


# A field whose line would be longer than this is shown an element (a list) or a key (an
# object) a line: a list of 20 egress rules is one 4 kB line, and widening one of them showed as
# two such lines, differing in a few characters nobody finds. Shorter fields stay whole lines,
# as they always were (a tool list, a route, a skill's summary).
_WHOLE_LINE = 500
_ABSENT = object()


def diff_lines(before: str, after: str) -> list[str]:
    """A unified diff of the agent's view, one field per line, strings JSON-escaped so control
    and bidi characters are visible as escapes. A field too long for a line is split, in before
    and after alike, an element a line (``egress[]: {...}``) or a key a line
    (``permissions.allow[]: ...``), so that an unchanged rule is an unchanged line of context
    and a changed one a short line of its own. Elements carry no index: one inserted first would
    renumber, and so change, every line after it."""
    old, new = json.loads(before) or {}, json.loads(after) or {}
    old_lines: list[str] = []
    new_lines: list[str] = []
    for key in sorted(set(old) | set(new)):
        before_value, after_value = old.get(key, _ABSENT), new.get(key, _ABSENT)
        old_lines += _shown(key, before_value, after_value)
        new_lines += _shown(key, after_value, before_value)
    return list(difflib.unified_diff(old_lines, new_lines, "before", "after", lineterm=""))


def _shown(path: str, value: Any, other: Any) -> list[str]:
    """The lines of ``value`` at ``path``; ``other`` is the other side's value there (or
    _ABSENT): a value too long for a line on either side splits both sides alike."""
    if value is _ABSENT:
        return []
    long = _too_long(path, value) or _too_long(path, other)
    if long and value and isinstance(value, dict):
        counterpart = other if isinstance(other, dict) else {}
        return [line for key in sorted(value)
                for line in _shown(f"{path}{_key(key)}", value[key],
                                   counterpart.get(key, _ABSENT))]  # fmt: skip
    if long and value and isinstance(value, list):
        return [f"{path}[]: {_escaped(item)}" for item in value]
    return [f"{path}: {_escaped(value)}"]


def _too_long(path: str, value: Any) -> bool:
    return value is not _ABSENT and len(path) + 2 + len(_escaped(value)) > _WHOLE_LINE


def _escaped(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True)


def _key(key: str) -> str:
    # A key that is not a plain word is quoted: a dot or a bracket in it cannot forge a path.
    if key and key.isascii() and key.replace("_", "").replace("-", "").isalnum():
        return f".{key}"
    return f"[{_escaped(key)}]"
