"""``egress``: replace the agent's egress grants as a whole (an empty list revokes them all)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.egress import EgressRule, requested_rule
from ironclawd.domain.kinds.base import ChangeKind, only
from ironclawd.errors import InvalidArgument, PolicyDenied

MAX_EGRESS_RULES = 64


@dataclass(frozen=True)
class Egress:
    rules: tuple[EgressRule, ...]


def rule_to_mapping(rule: EgressRule) -> dict[str, Any]:
    out = dataclasses.asdict(rule)
    out["methods"] = list(rule.methods)
    out["path_prefixes"] = list(rule.path_prefixes)
    return out


class EgressKind(ChangeKind[Egress]):
    name = "egress"

    def parse(self, payload: Mapping[str, Any]) -> Egress:
        """Every rule parses (scheme, host, port, methods, path prefixes) within the bounds of
        a requested rule (domain/egress.py ``requested_rule``)."""
        only(payload, self.name, {"rules"})
        rules = payload.get("rules")
        if not isinstance(rules, list) or len(rules) > MAX_EGRESS_RULES:
            raise InvalidArgument(
                f"payload.rules: expected a list of at most {MAX_EGRESS_RULES} rules"
            )
        parsed = []
        for index, raw in enumerate(rules):
            try:
                parsed.append(requested_rule(raw))
            except (ValueError, TypeError) as exc:
                raise InvalidArgument(f"payload.rules[{index}]: expected {exc}") from None
        return Egress(tuple(parsed))

    def dump(self, payload: Egress) -> dict[str, Any]:
        return {"rules": [rule_to_mapping(r) for r in payload.rules]}

    def apply(self, spec: AgentSpec, payload: Egress) -> AgentSpec:
        return dataclasses.replace(spec, egress=payload.rules)

    def view(self, spec: AgentSpec) -> dict[str, Any]:
        return {"egress": [rule_to_mapping(r) for r in spec.egress]}

    def authorize(self, payload: Egress, submitter: str) -> None:
        # A rule that injects a host-held credential towards a host of the agent's choosing is
        # a key-exfiltration request: only an operator may write one.
        if submitter.startswith("session:") and any(r.credential for r in payload.rules):
            raise PolicyDenied("egress rules with a credential can only come from an operator")


KIND = EgressKind()
