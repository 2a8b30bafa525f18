"""The egress broker's service logic with a hostile resolver and a recording upstream: no
network. Shows: resolve once, connect only to the checked address; a poisoned answer spoils the
name; credentials stripped and injected (and masked coming back); caps; every decision audited."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

from ironclawd import ratelog
from ironclawd.config import parse_config
from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.egress import EgressDecision, EgressLimits, EgressRule
from ironclawd.errors import (
    BudgetExceeded,
    ConfigError,
    InvalidArgument,
    PolicyDenied,
    UpstreamFailed,
)
from ironclawd.host.clock import SystemClock
from ironclawd.ports import Clock, UpstreamRequest
from ironclawd.services.egress import EgressBroker, End, Head
from tests.fakes import FakeClock, FakeCredentials, StaticSessions

SECRET = "s3cr3t-host-held-token"
PUBLIC = "93.184.215.14"  # never contacted: the upstream here is a fake


class HostileResolver:
    """Answers a public address first and loopback on every later query (DNS rebinding)."""

    def __init__(self, answers: dict[str, list[list[str]]] | None = None) -> None:
        self.calls: list[str] = []
        self._answers = answers or {}

    async def resolve(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        script = self._answers.get(host, [[PUBLIC], ["127.0.0.1"]])
        return script[min(len(self.calls) - 1, len(script) - 1)]


@dataclass
class FakeResponse:
    status: int = 200
    reason: str = "OK"
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "text/plain"),)
    body: list[bytes] = field(default_factory=lambda: [b"hello"])
    delay: float = 0.0
    closed: bool = False

    async def read_chunk(self) -> bytes:
        if self.delay:
            await asyncio.sleep(self.delay)
        return self.body.pop(0) if self.body else b""

    async def close(self) -> None:
        self.closed = True


class RecordingUpstream:
    def __init__(self, response: FakeResponse | None = None) -> None:
        self.sent: list[UpstreamRequest] = []
        self.response = response or FakeResponse()

    async def send(self, request: UpstreamRequest) -> FakeResponse:
        self.sent.append(request)
        return self.response


RULES = (
    EgressRule("api.example.com", methods=("GET", "POST"), path_prefixes=("/v1/",)),
    EgressRule("keyed.example.com", credential="api-token"),
    EgressRule("198.51.100.1", scheme="http"),
)


def make(
    upstream: RecordingUpstream | None = None,
    resolver: HostileResolver | None = None,
    clock: Clock | None = None,
    **limits: Any,
) -> tuple[EgressBroker, RecordingUpstream, HostileResolver, list[EgressDecision]]:
    upstream = upstream or RecordingUpstream()
    resolver = resolver or HostileResolver()
    decisions: list[EgressDecision] = []
    broker = EgressBroker(
        sessions=StaticSessions(default="fetcher", nogrants="demo"),
        agents={"fetcher": AgentSpec("fetcher", egress=RULES), "demo": AgentSpec("demo")},
        resolver=resolver,
        upstream=upstream,
        credentials=FakeCredentials(**{"api-token": SECRET}),
        limits=EgressLimits(**limits),
        clock=clock or SystemClock(),
        record=decisions.append,
    )
    return broker, upstream, resolver, decisions


def run(broker: EgressBroker, url: str, method: str = "GET", headers: Any = (), body: bytes = b"",
        sid: str = "sess0001") -> list[Any]:  # fmt: skip
    async def go() -> list[Any]:
        return [e async for e in broker.fetch(sid, method, url, list(headers), body)]

    return asyncio.run(go())


def test_allowed_fetch_streams_head_body_end_and_is_audited() -> None:
    broker, upstream, _, decisions = make()
    events = run(broker, "https://api.example.com/v1/items?token=abc")
    assert events == [Head(200, "OK", (("Content-Type", "text/plain"),)), b"hello", End(False, 5)]
    (sent,) = upstream.sent
    assert (sent.address, sent.host, sent.port, sent.scheme) == (PUBLIC, "api.example.com", 443,
                                                                   "https")  # fmt: skip
    assert sent.target == "/v1/items?token=abc"
    assert ("Host", "api.example.com") in sent.headers
    (d,) = decisions
    assert (d.verdict, d.address, d.status, d.bytes_in, d.path) == (
        "allowed",
        PUBLIC,
        200,
        5,
        "/v1/items",
    )
    assert "token" not in d.path
    assert d.rule.startswith("GET,POST https://api.example.com:443")


def test_a_request_with_more_headers_than_a_request_may_carry_is_refused_unsent() -> None:
    broker, upstream, _, decisions = make()
    headers = [(f"X-{n}", "v") for n in range(101)]
    with pytest.raises(InvalidArgument, match="101 given; expected at most 100"):
        run(broker, "https://api.example.com/v1/items", headers=headers)
    assert upstream.sent == []
    assert [d.verdict for d in decisions] == ["denied"]


def test_rebinding_resolver_is_asked_once_and_loopback_never_reached() -> None:
    broker, upstream, resolver, _ = make()
    run(broker, "https://api.example.com/v1/a")
    assert resolver.calls == ["api.example.com"]
    assert [r.address for r in upstream.sent] == [PUBLIC]
    # The next request resolves afresh, meets loopback, and is refused before any connection.
    with pytest.raises(PolicyDenied, match=r"resolves to 127\.0\.0\.1, a loopback"):
        run(broker, "https://api.example.com/v1/b")
    assert len(upstream.sent) == 1


@pytest.mark.parametrize(
    "answers",
    [[PUBLIC, "127.0.0.1"], ["10.0.0.5", PUBLIC], ["::ffff:127.0.0.1"], ["169.254.169.254"],
     [PUBLIC, "fd00:ec2::254"], ["100.64.1.1"], ["0.0.0.0"], ["fe80::1%eth0"]],
)  # fmt: skip
def test_any_refused_answer_spoils_the_name(answers: list[str]) -> None:
    broker, upstream, _, decisions = make(resolver=HostileResolver({"api.example.com": [answers]}))
    with pytest.raises(PolicyDenied, match="resolves to"):
        run(broker, "https://api.example.com/v1/")
    assert upstream.sent == []
    assert decisions[-1].verdict == "denied"
    assert "resolves to" in decisions[-1].reason


@pytest.mark.parametrize(
    ("answers", "kind"),
    [(["10.1.2.3"], "a private address"), ([PUBLIC, "100.64.7.7"], "CGNAT"),
     (["fd12:3456::5"], "a private address"), (["::ffff:10.1.2.3"], "IPv4-mapped")],
)  # fmt: skip
def test_a_names_internal_answer_goes_to_the_audit_not_to_the_agent(
    answers: list[str], kind: str
) -> None:
    """The denial told the agent "<host> resolves to 10.x.y.z, a private address": the inside
    network's addresses, one name at a time (found by a review)."""
    broker, upstream, _, decisions = make(resolver=HostileResolver({"api.example.com": [answers]}))
    with pytest.raises(PolicyDenied, match=r"api\.example\.com resolves to a refused") as e:
        run(broker, "https://api.example.com/v1/")
    internal = ipaddress.ip_address(answers[-1])
    assert kind in str(e.value)
    assert not any(form in str(e.value) for form in (answers[-1], str(internal), "10.1.2.3"))
    assert f"resolves to {internal}, a" in decisions[-1].reason
    assert decisions[-1].verdict == "denied"
    assert upstream.sent == []


def test_internal_cidrs_open_a_documentation_range() -> None:
    docs = (ipaddress.ip_network("198.51.100.0/24"),)
    broker, upstream, _, _ = make(internal_cidrs=docs)
    run(broker, "http://198.51.100.1/x")
    assert upstream.sent[0].address == "198.51.100.1"
    broker, upstream, _, _ = make()
    with pytest.raises(PolicyDenied, match="private"):
        run(broker, "http://198.51.100.1/x")


def test_agent_credentials_are_stripped_and_a_rules_is_injected() -> None:
    broker, upstream, _, decisions = make()
    agent_headers = [("Cookie", "c=1"), ("Accept-Encoding", "gzip")]
    events = run(broker, "https://keyed.example.com/", headers=agent_headers)
    sent = dict(upstream.sent[0].headers)
    assert sent["Authorization"] == f"Bearer {SECRET}"
    assert "Cookie" not in sent
    assert sent["Accept-Encoding"] == "identity"
    assert events[-1] == End(False, 5)
    assert "stripped Accept-Encoding, Cookie" in decisions[0].reason
    broker, upstream, _, _ = make()
    run(broker, "https://api.example.com/v1/", headers=[("X-Api-Key", "k"), ("Authorization", "x")])
    assert [k for k, _ in upstream.sent[0].headers] == ["Host", "Accept-Encoding"]


def test_a_method_override_header_is_refused_unsent_and_audited() -> None:
    broker, upstream, _, decisions = make()
    with pytest.raises(PolicyDenied, match="X-HTTP-Method-Override: it overrides the method"):
        run(broker, "https://api.example.com/v1/x", "POST",
            headers=[("X-HTTP-Method-Override", "DELETE")])  # fmt: skip
    assert upstream.sent == []
    (d,) = decisions
    assert d.verdict == "denied"
    assert "X-HTTP-Method-Override" in d.reason


def test_redirects_are_returned_not_followed() -> None:
    redirect = FakeResponse(302, "Found", (("Location", "http://127.0.0.1/admin"),), [])
    broker, upstream, _, _ = make(RecordingUpstream(redirect))
    events = run(broker, "https://api.example.com/v1/")
    assert events[0].status == 302
    assert len(upstream.sent) == 1


def test_response_cap_truncates() -> None:
    big = FakeResponse(body=[b"x" * 1500, b"y" * 1500])
    broker, _, _, decisions = make(RecordingUpstream(big), max_response_bytes=2048)
    events = run(broker, "https://api.example.com/v1/")
    assert sum(len(e) for e in events if isinstance(e, bytes)) == 2048
    assert events[-1] == End(True, 2048)
    assert big.closed
    assert "truncated" in decisions[0].reason


def test_slow_upstream_hits_the_deadline_and_is_closed() -> None:
    slow = FakeResponse(body=[b"a"] * 100, delay=0.05)
    broker, _, _, decisions = make(RecordingUpstream(slow), timeout_seconds=0.2)
    with pytest.raises(UpstreamFailed, match="no complete answer within"):
        run(broker, "https://api.example.com/v1/")
    assert slow.closed
    assert decisions[0].verdict == "failed"


def test_request_body_cap_and_rate_limit() -> None:
    resolver = HostileResolver({"api.example.com": [[PUBLIC]]})
    broker, upstream, _, _ = make(max_request_bytes=10, requests_per_minute=3, resolver=resolver)
    with pytest.raises(PolicyDenied, match="exceeds the cap"):
        run(broker, "https://api.example.com/v1/", "POST", body=b"x" * 11)  # counts too
    run(broker, "https://api.example.com/v1/")
    run(broker, "https://api.example.com/v1/")
    with pytest.raises(BudgetExceeded, match="3 requests per minute"):
        run(broker, "https://api.example.com/v1/")
    assert len(upstream.sent) == 2
    run(broker, "https://api.example.com/v1/", sid="sess0002")  # another session has its own budget


def test_concurrent_connections_per_session_are_capped() -> None:
    slow = FakeResponse(body=[b"a"], delay=0.3)
    resolver = HostileResolver({"api.example.com": [[PUBLIC]]})
    broker, _, _, _ = make(RecordingUpstream(slow), resolver, max_connections_per_session=1)

    async def both() -> list[Any]:
        async def one() -> Any:
            url = "https://api.example.com/v1/"
            return [e async for e in broker.fetch("sess0001", "GET", url, [], b"")]

        return list(await asyncio.gather(one(), one(), return_exceptions=True))

    results = asyncio.run(both())
    assert sum(isinstance(r, BudgetExceeded) for r in results) == 1


def test_sessions_without_grants_are_refused_and_get_no_socket() -> None:
    broker, upstream, _, decisions = make()
    assert broker.has_grants("sess0001")
    assert not broker.has_grants("nogrants")
    with pytest.raises(PolicyDenied, match="no egress grants"):
        run(broker, "https://api.example.com/v1/", sid="nogrants")
    with pytest.raises(InvalidArgument):
        run(broker, "https://api.example.com/v1/", method="CONNECT")
    assert upstream.sent == []
    assert [d.verdict for d in decisions] == ["denied", "denied"]


def test_config_parses_egress_rules_and_refuses_never_ranges() -> None:
    config = parse_config(
        '[egress]\ninternal_cidrs = ["198.51.100.0/24"]\n'
        '[agents.fetcher]\ntools = ["http_fetch"]\n'
        'egress = [{host = "api.example.com", methods = ["GET"], path_prefixes = ["/v1/"]}]\n',
        "test",
    )
    assert config.egress.internal_cidrs == (ipaddress.ip_network("198.51.100.0/24"),)
    assert config.agents[0].egress == (EgressRule("api.example.com", path_prefixes=("/v1/",)),)
    for bad in ('[egress]\ninternal_cidrs = ["127.0.0.0/8"]\n',
                '[agents.x]\negress = [{host = "a.example.com", scheme = "ftp"}]\n'):  # fmt: skip
        with pytest.raises(ConfigError, match="egress"):
            parse_config(bad, "test")


def test_a_loop_of_denied_requests_costs_the_journal_a_bounded_number_of_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A box decides how many requests it makes; its lines share one throttle per session and
    # verdict, and past its rate its refusals reach the audit log at most 20 a minute.
    ratelog.AGENT_LOG.configure(per_window=5, window_seconds=3600)
    try:
        broker, upstream, _, decisions = make()
        with caplog.at_level(logging.INFO, logger="ironclawd.egress"):
            for _ in range(200):
                with pytest.raises(PolicyDenied):
                    run(broker, "https://evil.example.net/", sid="flood0001")
        lines = [r for r in caplog.records if r.name == "ironclawd.egress"]
        assert len(decisions) == 60 + 20  # the session's rate, then 20 refusals for it
        assert not upstream.sent
        assert 1 <= len(lines) <= 5, len(lines)
    finally:
        ratelog.AGENT_LOG.configure(ratelog.DEFAULT_PER_WINDOW, ratelog.DEFAULT_WINDOW_SECONDS)


def test_denied_requests_count_against_the_rate_and_over_it_cost_a_bounded_record() -> None:
    """A denied request was refused before the session's rate was charged, so a loop of them
    (each ~1 KB of host, path and reason in the append-only audit log) filled the disk at will
    (stop 47's review). Every request counts now, and every decision within the rate is
    recorded; refusals for the rate itself are recorded at most 20 a minute, the next one
    saying how many were left out."""
    clock = FakeClock()
    broker, _, _, decisions = make(clock=clock, requests_per_minute=30)
    host = ".".join(["a" * 63] * 3) + ".example"
    for _ in range(500):
        with pytest.raises(PolicyDenied):
            run(broker, f"https://{host}/" + "p" * 500, sid="flood0001")
    with pytest.raises(PolicyDenied, match="no rule for host"):
        run(broker, "https://evil.example.net/", sid="other0001")  # another session's own rate
    flood = [d for d in decisions if d.sid == "flood0001"]
    assert len(flood) == 30 + 20
    assert all("no rule for host" in d.reason for d in flood[:30])
    assert all("rate limit of 30 requests per minute" in d.reason for d in flood[30:])
    clock.advance(60)
    for _ in range(31):
        with pytest.raises(PolicyDenied):
            run(broker, "https://evil.example.net/", sid="flood0001")
    assert "no rule for host" in decisions[-2].reason
    assert "rate limit" in decisions[-1].reason
    assert decisions[-1].unrecorded_before == 450
