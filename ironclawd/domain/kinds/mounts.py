"""``mounts``: replace the host directories granted to the agent (at ``/mnt/<name>``)."""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ironclawd.domain.agents import MAX_AGENT_MOUNTS, MOUNT_NAME_RE, AgentMount, AgentSpec
from ironclawd.domain.kinds.base import ChangeKind, HostChecks, only
from ironclawd.errors import InvalidArgument


@dataclass(frozen=True)
class Mounts:
    mounts: tuple[AgentMount, ...]


class MountsKind(ChangeKind[Mounts]):
    name = "mounts"

    def parse(self, payload: Mapping[str, Any]) -> Mounts:
        """At most MAX_AGENT_MOUNTS of {source, name, read_only}; names unique and
        [a-z0-9-]{1,32}; sources absolute and normalised (no '..'), none inside another.
        Whether a source is a real directory under the operator's allowlist is the host check,
        repeated at every session start. The list replaces the agent's mounts as a whole."""
        only(payload, self.name, {"mounts"})
        mounts = payload.get("mounts")
        if not isinstance(mounts, list) or len(mounts) > MAX_AGENT_MOUNTS:
            raise InvalidArgument(
                f"payload.mounts: expected a list of at most {MAX_AGENT_MOUNTS} mounts"
            )
        out = tuple(_mount(index, raw) for index, raw in enumerate(mounts))
        names = [m.name for m in out]
        if len(set(names)) != len(names):
            raise InvalidArgument("payload.mounts: expected each name once")
        for a in out:
            for b in out:
                if a is not b and (a.source == b.source or b.source.startswith(a.source + "/")):
                    raise InvalidArgument(
                        f"payload.mounts: {b.source} overlaps {a.source}; grant one of them"
                    )
        return Mounts(out)

    def dump(self, payload: Mounts) -> dict[str, Any]:
        return {"mounts": [dataclasses.asdict(m) for m in payload.mounts]}

    def apply(self, spec: AgentSpec, payload: Mounts) -> AgentSpec:
        return dataclasses.replace(spec, mounts=payload.mounts)

    def view(self, spec: AgentSpec) -> dict[str, Any]:
        # Only when there are any: changes submitted before mounts existed keep their `before`.
        return {"mounts": [dataclasses.asdict(m) for m in spec.mounts]} if spec.mounts else {}

    def host_check(self, payload: Mounts, host: HostChecks) -> None:
        for mount in payload.mounts:
            host.mount_source(mount.source)

    def host_check_for(self, agent: str, payload: Mounts, host: HostChecks) -> None:
        self.host_check(payload, host)
        host.mount_overlap(agent, payload.mounts)


def _mount(index: int, raw: object) -> AgentMount:
    where = f"payload.mounts[{index}]"
    if not isinstance(raw, dict):
        raise InvalidArgument(f"{where}: expected an object with source, name, read_only")
    only(raw, "mounts", {"source", "name", "read_only"})
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
    return AgentMount(name=name, source=source, read_only=read_only)


KIND = MountsKind()
