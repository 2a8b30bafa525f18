"""Where the egress broker checks for a rule's credential (ironclawd/services/egress.py): through
every rule of a host that a credential rule names, not only through that rule. A fake upstream
that remembers what it was sent, no network."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.egress import EgressDecision, EgressLimits, EgressRule
from ironclawd.errors import ResponseRefused
from ironclawd.host.clock import SystemClock
from ironclawd.ports import UpstreamRequest
from ironclawd.services.egress import EgressBroker
from tests.fakes import FakeCredentials, StaticSessions
from tests.harness.leaks import find_leaks
from tests.unit.test_egress_broker import PUBLIC, SECRET, FakeResponse, HostileResolver


class RememberingUpstream:
    """Answers /debug/last with the headers of the request before it (a request log)."""

    def __init__(self) -> None:
        self.last = b"{}"
        self.sent: list[UpstreamRequest] = []

    async def send(self, request: UpstreamRequest) -> FakeResponse:
        self.sent.append(request)
        if request.target.startswith("/debug/"):
            return FakeResponse(body=[self.last])
        self.last = repr(request.headers).encode()
        return FakeResponse(body=[b"{}"])


def broker_for(
    rules: tuple[EgressRule, ...], upstream: RememberingUpstream, **credentials: str
) -> tuple[EgressBroker, list[EgressDecision]]:
    decisions: list[EgressDecision] = []
    hosts = {h: [[PUBLIC]] for h in ("api.example.com", "other.example.com")}
    broker = EgressBroker(
        sessions=StaticSessions(default="fetcher"),
        agents={"fetcher": AgentSpec("fetcher", egress=rules)},
        resolver=HostileResolver(hosts), upstream=upstream,
        credentials=FakeCredentials(**credentials), limits=EgressLimits(), clock=SystemClock(),
        record=decisions.append,
    )  # fmt: skip
    return broker, decisions


def body_of(broker: EgressBroker, url: str) -> bytes:
    async def go() -> list[Any]:
        return [e async for e in broker.fetch("sess0001", "GET", url, [], b"")]

    return b"".join(e for e in asyncio.run(go()) if isinstance(e, bytes))


KEYED = EgressRule("api.example.com", path_prefixes=("/v1/",), credential="api-token")
DEBUG = EgressRule("api.example.com", path_prefixes=("/debug/",))


def test_a_plain_rule_on_a_credential_rules_host_does_not_hand_back_the_credential() -> None:
    upstream = RememberingUpstream()
    broker, decisions = broker_for((KEYED, DEBUG), upstream, **{"api-token": SECRET})
    body_of(broker, "https://api.example.com/v1/items")
    with pytest.raises(ResponseRefused, match="body carries the injected credential") as caught:
        body_of(broker, "https://api.example.com/debug/last")
    assert find_leaks(upstream.last, [SECRET]), "control: the upstream kept it"
    assert not find_leaks(str(caught.value), [SECRET])
    assert [d.verdict for d in decisions] == ["allowed", "failed"]
    assert "response refused" in decisions[1].reason
    # The plain rule itself injects nothing.
    assert not any(k == "Authorization" for k, _ in upstream.sent[1].headers)


def test_a_wildcard_credential_rule_guards_the_plain_rules_under_it() -> None:
    upstream = RememberingUpstream()
    wild = EgressRule("*.example.com", path_prefixes=("/v1/",), credential="api-token")
    broker, _ = broker_for((wild, DEBUG), upstream, **{"api-token": SECRET})
    body_of(broker, "https://api.example.com/v1/items")
    with pytest.raises(ResponseRefused, match="body carries the injected credential"):
        body_of(broker, "https://api.example.com/debug/last")


def test_other_hosts_and_a_missing_sibling_credential_leave_a_plain_rule_alone() -> None:
    upstream = RememberingUpstream()
    other = EgressRule("other.example.com", path_prefixes=("/debug/",))
    broker, decisions = broker_for((KEYED, DEBUG, other), upstream, **{"api-token": SECRET})
    body_of(broker, "https://api.example.com/v1/items")
    # The same fake answers for another host, where no rule injects anything: its answers
    # stream unchecked, at no cost (what it says is its own business).
    assert find_leaks(body_of(broker, "https://other.example.com/debug/last"), [SECRET])
    # A credential that is not there was never injected: the plain rule still works.
    broker, decisions = broker_for((KEYED, DEBUG), RememberingUpstream())
    assert body_of(broker, "https://api.example.com/debug/last") == b"{}"
    assert [d.verdict for d in decisions] == ["allowed"]
