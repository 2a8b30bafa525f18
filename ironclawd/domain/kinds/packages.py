"""``packages``: set the Debian packages of an agent's image (docs/packages.md).

A submitter gives names only (``{"packages": ["jq"]}``; the list replaces the agent's, so ``[]``
removes them all). At submission the host resolves them against the archive (apt, with the base
image's packages as installed) and the stored payload gains ``resolved``: every package that
will be unpacked, dependencies included, with its version, architecture, ``.deb`` size and
SHA-256. The approver sees that set diffed and the change's hash covers it; a submitter who
sends a ``resolved`` of its own is refused. Before the change applies, the host builds the image
from exactly those ``.deb`` files (each re-checked against its approved hash).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.kinds.base import ChangeKind, HostChecks, only
from ironclawd.domain.packages import (
    AgentPackage,
    check_names,
    package_from_mapping,
    package_to_mapping,
)
from ironclawd.errors import InvalidArgument


@dataclass(frozen=True)
class Packages:
    names: tuple[str, ...]  # as asked, checked
    resolved: tuple[AgentPackage, ...] | None  # None until the host resolved the names


class PackagesKind(ChangeKind[Packages]):
    name = "packages"

    def parse(self, payload: Mapping[str, Any]) -> Packages:
        only(payload, self.name, {"packages", "resolved"})
        names = check_names(payload.get("packages"))
        raw = payload.get("resolved")
        if raw is None:
            return Packages(names, None)
        if not isinstance(raw, list):
            raise InvalidArgument("payload.resolved: expected a list of packages")
        resolved = tuple(
            package_from_mapping(item, f"payload.resolved[{i}]") for i, item in enumerate(raw)
        )
        requested = sorted(p.name for p in resolved if p.requested)
        if requested != sorted(names):
            raise InvalidArgument(
                "payload.resolved: its requested packages "
                f"({', '.join(requested) or 'none'}) are not the names asked for "
                f"({', '.join(sorted(names)) or 'none'})"
            )
        if len({p.name for p in resolved}) != len(resolved):
            raise InvalidArgument("payload.resolved: a package is listed twice")
        return Packages(names, resolved)

    def dump(self, payload: Packages) -> dict[str, Any]:
        out: dict[str, Any] = {"packages": list(payload.names)}
        if payload.resolved is not None:
            out["resolved"] = [package_to_mapping(p) for p in payload.resolved]
        return out

    def resolve(self, payload: Packages, host: HostChecks) -> Packages:
        if payload.resolved is not None:
            raise InvalidArgument(
                "payload.resolved: ironclawd resolves the names itself; give names only "
                '({"packages": ["jq"]})'
            )
        return Packages(payload.names, host.resolve_packages(payload.names))

    def apply(self, spec: AgentSpec, payload: Packages) -> AgentSpec:
        if payload.resolved is None:
            raise InvalidArgument(
                "payload.resolved: missing; the packages were never resolved by the host"
            )
        ordered = tuple(sorted(payload.resolved, key=lambda p: p.name))
        return dataclasses.replace(spec, packages=ordered)

    def prepare(self, payload: Packages, host: HostChecks) -> None:
        if payload.resolved:
            host.prepare_packages(payload.resolved)

    def view(self, spec: AgentSpec) -> dict[str, Any]:
        # Absent while the agent has none: changes submitted before packages existed keep their
        # `before`.
        if not spec.packages:
            return {}
        return {"packages": [package_to_mapping(p) for p in spec.packages]}


KIND = PackagesKind()
