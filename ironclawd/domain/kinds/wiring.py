"""``wiring``: set which channel rooms and webhook endpoints reach the agent (docs/channels.md).

The payload ``{"routes": [{channel, where, engage, pattern, sessions, reply_url}, …]}`` replaces
the agent's whole wiring (``[]`` unwires it). Each ``(channel, where)`` appears once and may be
wired to one agent only: the host checks, at submission and again at apply, that the channel is
configured, that ``where`` fits its type (a Matrix room id, a configured webhook endpoint), that
only webhook routes name a ``reply_url``, and that no other agent is wired there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.channels import Route, is_room_id, route_from_mapping, route_to_mapping
from ironclawd.domain.kinds.base import ChangeKind, HostChecks, only
from ironclawd.errors import Conflict, InvalidArgument

MAX_ROUTES = 32


@dataclass(frozen=True)
class Wiring:
    routes: tuple[Route, ...]  # sorted by (channel, where)


class WiringKind(ChangeKind[Wiring]):
    name = "wiring"

    def parse(self, payload: Mapping[str, Any]) -> Wiring:
        only(payload, self.name, {"routes"})
        raw = payload.get("routes")
        if not isinstance(raw, list) or len(raw) > MAX_ROUTES:
            raise InvalidArgument(f"payload.routes: expected a list of at most {MAX_ROUTES} routes")
        routes = [route_from_mapping(item, f"payload.routes[{i}]") for i, item in enumerate(raw)]
        seen: set[tuple[str, str]] = set()
        for route in routes:
            key = (route.channel, route.where)
            if key in seen:
                raise InvalidArgument(
                    f"payload.routes: {route.channel} {route.where} is routed twice "
                    "(one route per room or endpoint)"
                )
            seen.add(key)
        return Wiring(tuple(sorted(routes, key=lambda r: (r.channel, r.where))))

    def dump(self, payload: Wiring) -> dict[str, Any]:
        return {"routes": [route_to_mapping(r) for r in payload.routes]}

    def apply(self, spec: AgentSpec, payload: Wiring) -> AgentSpec:
        return dataclasses.replace(spec, wiring=payload.routes)

    def view(self, spec: AgentSpec) -> dict[str, Any]:
        # Only when wired: changes submitted before wiring existed keep their `before`.
        return {"wiring": [route_to_mapping(r) for r in spec.wiring]} if spec.wiring else {}

    def host_check_for(self, agent: str, payload: Wiring, host: HostChecks) -> None:
        for i, route in enumerate(payload.routes):
            where = f"payload.routes[{i}]"
            kind = host.channel_kind(route.channel)
            if kind == "matrix":
                if not is_room_id(route.where):
                    raise InvalidArgument(
                        f"{where}.where: channel {route.channel} is a Matrix channel: expected a "
                        f"room id !id:server, got {route.where!r}"
                    )
                if route.reply_url:
                    raise InvalidArgument(
                        f"{where}.reply_url: only webhook routes have one (channel "
                        f"{route.channel} is Matrix: replies go to the room)"
                    )
            else:
                host.webhook_endpoint(route.channel, route.where)
            owner = host.route_owner(route.channel, route.where)
            if owner is not None and owner != agent:
                raise Conflict(
                    f"{where}: {route.channel} {route.where} is already wired to agent "
                    f"'{owner}'; unwire it there first"
                )


KIND = WiringKind()
