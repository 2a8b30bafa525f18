"""``permissions``: who may talk to the agent and who approves its changes (docs/channels.md).

The payload ``{"allow": [identity, …], "unknown": "drop"|"hold", "approvers": {kind: group}}``
replaces the agent's permissions as a whole. Identities are ``<channel>:<raw>`` (what the
channel's server asserts), ``user:<name>`` and ``group:<name>`` (host users who may
``ironctl send``; none named: any ``ironclaw-admin`` member may). ``approvers`` names, per change
kind, the host group whose members alone may approve or reject that kind for this agent (on top
of ``ironclaw-admin``). The host checks that every channel is configured and every group exists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.channels import (
    Permissions,
    permissions_from_mapping,
    permissions_to_mapping,
)
from ironclawd.domain.kinds.base import ChangeKind, HostChecks

NAME = "permissions"


class PermissionsKind(ChangeKind[Permissions]):
    name = NAME

    def parse(self, payload: Mapping[str, Any]) -> Permissions:
        # Here, not at module level: the registry of kinds imports this module.
        from ironclawd.domain.kinds import KINDS  # noqa: PLC0415

        return permissions_from_mapping(payload, kinds=tuple(KINDS), where="payload")

    def dump(self, payload: Permissions) -> dict[str, Any]:
        return permissions_to_mapping(payload)

    def apply(self, spec: AgentSpec, payload: Permissions) -> AgentSpec:
        return dataclasses.replace(spec, permissions=payload)

    def view(self, spec: AgentSpec) -> dict[str, Any]:
        # Only when set: changes submitted before permissions existed keep their `before`.
        if spec.permissions == Permissions():
            return {}
        return {"permissions": permissions_to_mapping(spec.permissions)}

    def host_check(self, payload: Permissions, host: HostChecks) -> None:
        for identity in payload.allow:
            prefix, _, rest = identity.partition(":")
            if prefix == "group":
                host.host_group(rest)
            elif prefix != "user":
                host.channel_kind(prefix)
        for _kind, group in payload.approvers:
            host.host_group(group)


KIND = PermissionsKind()
