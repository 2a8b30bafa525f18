"""The ``wiring`` kind: its payload refusals (each names the field), its host checks (the
channel configured, ``where`` of the channel's type, one agent per room) through the real
gateway and its host checks, and the rule that a wiring change applies only on approval."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.changes import ChangeState, check_payload
from ironclawd.domain.channels import ChannelConfig, Route, WebhookEndpoint
from ironclawd.errors import Conflict, InvalidArgument
from ironclawd.host.mounts import HostMounts
from ironclawd.services.gateway import Gateway, GatewayPolicy
from ironclawd.services.registry import Registry
from tests.fakes import FakeClock, MemoryAgents, MemoryChanges, RecordingAudit

ROOT = "uid:0(root)"
ROOM = "!room:example.org"
CHANNELS = (
    ChannelConfig("chat", "matrix", homeserver="https://m.example.org", user_id="@bot:x",
                  token_credential="bot-token"),
    ChannelConfig("hooks", "webhook", listen="127.0.0.1:8787",
                  endpoints=(WebhookEndpoint("github", "gh-secret"),)),
)  # fmt: skip


class World:
    def __init__(self) -> None:
        self.clock = FakeClock(1000.0)
        self.store = MemoryChanges()
        agents = [AgentSpec("demo"), AgentSpec("other")]
        self.agents = MemoryAgents()
        self.registry = Registry(self.agents, agents, self.clock)
        self.audit = RecordingAudit()
        self.restarted: list[str] = []
        self.gateway = Gateway(
            store=self.store, registry=self.registry, audit=self.audit, policy=GatewayPolicy(),
            restart_agent_sessions=self._restart, mounts=HostMounts(), clock=self.clock,
            channels=CHANNELS,
        )  # fmt: skip

    async def _restart(self, agent: str) -> list[str]:
        self.restarted.append(agent)
        return []

    def submit(self, routes: list[dict[str, Any]], agent: str = "demo") -> Any:
        return self.gateway.submit("wiring", agent, json.dumps({"routes": routes}), "", ROOT)


def _payload(routes: Any) -> str:
    return json.dumps({"routes": routes})


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ("{}", "payload.routes: expected a list of at most 32 routes"),
        ('{"routes": {}}', "payload.routes: expected a list of at most 32 routes"),
        (_payload([{"channel": "chat", "where": f"!r{i}:x"} for i in range(33)]),
         "payload.routes: expected a list of at most 32"),
        (_payload([{"channel": "chat", "where": ROOM}] * 2), "payload.routes: chat !room:example."
         "org is routed twice"),
        (_payload([{"channel": "chat"}]), "payload.routes[0].where: expected a Matrix room id"),
        (_payload([{"where": ROOM}]), "payload.routes[0].channel: expected a channel name"),
        (_payload([{"channel": "chat", "where": ROOM, "engage": "pattern", "pattern": "(a+)+"}]),
         "payload.routes[0].pattern: a repeat inside a repeat"),
        ('{"routes": [], "rooms": []}', "payload for wiring: unexpected key(s) rooms"),
    ],
)  # fmt: skip
def test_every_bad_wiring_payload_is_refused_naming_the_field(payload: str, needle: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_payload("wiring", "demo", payload)
    assert needle in str(err.value), str(err.value)


def test_routes_are_stored_sorted_and_canonical() -> None:
    routes = [{"channel": "hooks", "where": "github", "engage": "always"},
              {"channel": "chat", "where": ROOM, "sessions": "per_room"}]  # fmt: skip
    assert check_payload("wiring", "demo", _payload(routes)) == {"routes": [
        {"channel": "chat", "where": ROOM, "sessions": "per_room"},
        {"channel": "hooks", "where": "github"},
    ]}  # fmt: skip


@pytest.mark.parametrize(
    ("route", "needle"),
    [
        ({"channel": "irc", "where": ROOM}, "channel 'irc' is not configured (configured "
         "channels: chat, hooks;"),
        ({"channel": "chat", "where": "github"}, "payload.routes[0].where: channel chat is a "
         "Matrix channel: expected a room id"),
        ({"channel": "chat", "where": ROOM, "reply_url": "https://x.example/"},
         "payload.routes[0].reply_url: only webhook routes have one"),
        ({"channel": "hooks", "where": "gitlab"}, "channel hooks has no webhook endpoint "
         "'gitlab' (configured: github)"),
        ({"channel": "hooks", "where": ROOM}, "channel hooks has no webhook endpoint"),
    ],
)  # fmt: skip
def test_the_host_refuses_routes_that_do_not_fit_the_configured_channels(
    route: dict[str, Any], needle: str
) -> None:
    w = World()
    with pytest.raises(InvalidArgument) as err:
        w.submit([route])
    assert needle in str(err.value), str(err.value)
    assert w.store.changes == {}  # nothing queued


def test_a_wiring_change_waits_for_approval_and_one_room_reaches_one_agent() -> None:
    w = World()
    routes = [
        {"channel": "chat", "where": ROOM, "engage": "mention"},
        {"channel": "hooks", "where": "github", "reply_url": "https://ci.example/r"},
    ]
    change = w.submit(routes)
    assert change.state is ChangeState.PENDING
    assert not w.registry["demo"].wiring  # nothing until a human approves
    # A second agent may ask for the same room while the first is only pending...
    rival = w.submit([{"channel": "chat", "where": ROOM}], agent="other")
    applied = asyncio.run(w.gateway.approve(change.id, change.hash, ROOT))
    assert applied.state is ChangeState.APPLIED
    assert w.registry["demo"].wiring == (
        Route("chat", ROOM, engage="mention"),
        Route("hooks", "github", reply_url="https://ci.example/r"),
    )
    assert w.restarted == ["demo"]
    # ... but its approval re-checks at apply and fails: the room is demo's now.
    with pytest.raises(Conflict, match=r"chat !room:example.org is already wired to agent 'demo'"):
        asyncio.run(w.gateway.approve(rival.id, rival.hash, ROOT))
    assert w.store.changes[rival.id].state is ChangeState.FAILED
    assert w.registry["other"].wiring == ()
    # And a new request for it is refused at once; demo itself may re-wire its own room.
    with pytest.raises(Conflict, match="already wired to agent 'demo'"):
        w.submit([{"channel": "chat", "where": ROOM}], agent="other")
    again = w.submit([{"channel": "chat", "where": ROOM, "sessions": "shared"}])
    assert again.state is ChangeState.PENDING
    # The wiring survives the registry's JSON round trip (a daemon restart).
    reread = Registry(w.agents, [], w.clock)
    assert reread["demo"] == w.registry["demo"]


def test_the_approver_sees_the_wiring_diffed() -> None:
    w = World()
    change = w.submit([{"channel": "chat", "where": ROOM}])
    assert json.loads(change.after)["wiring"] == [{"channel": "chat", "where": ROOM}]
    assert "wiring" not in json.loads(change.before)  # not shown while unwired
