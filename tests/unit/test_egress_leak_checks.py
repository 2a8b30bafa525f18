"""Where and at what cost the egress broker checks for a rule's credential
(ironclawd/services/egress.py, ironclawd/domain/egress_secrets.py): through every rule of a host
that a credential rule names, not only through that rule; in the broker's own threads, never on
the event loop; within a bound on the escapes the decoders are given; and a request that is
cancelled keeps its connection slot until its check ends. Fake upstreams, no network."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

import ironclawd.services.egress as egress_service
from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.egress import EgressDecision, EgressLimits, EgressRule
from ironclawd.domain.egress_secrets import (
    MAX_ESCAPES,
    SecretDetector,
    check_request,
    checked_body,
    checked_head,
)
from ironclawd.errors import BudgetExceeded, PolicyDenied, ResponseRefused
from ironclawd.host.clock import SystemClock
from ironclawd.ports import UpstreamRequest
from ironclawd.services.egress import EgressBroker
from ironclawd.services.egress_checks import CHECK_THREAD_NAME
from tests.fakes import FakeCredentials, StaticSessions
from tests.harness.leaks import find_leaks
from tests.unit.test_egress_broker import PUBLIC, SECRET, FakeResponse, HostileResolver


class QuietUpstream:
    """Answers every request with the same empty JSON object."""

    async def send(self, request: UpstreamRequest) -> FakeResponse:
        return FakeResponse(body=[b"{}"])


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
    rules: tuple[EgressRule, ...],
    upstream: Any,
    *,
    with_secret: bool = True,
    limits: EgressLimits | None = None,
) -> tuple[EgressBroker, list[EgressDecision]]:
    decisions: list[EgressDecision] = []
    hosts = {h: [[PUBLIC]] for h in ("api.example.com", "other.example.com")}
    broker = EgressBroker(
        sessions=StaticSessions(default="fetcher"),
        agents={"fetcher": AgentSpec("fetcher", egress=rules)},
        resolver=HostileResolver(hosts), upstream=upstream,
        credentials=FakeCredentials(**({"api-token": SECRET} if with_secret else {})),
        limits=limits or EgressLimits(), clock=SystemClock(), record=decisions.append,
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
    broker, decisions = broker_for((KEYED, DEBUG), upstream)
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
    broker, _ = broker_for((wild, DEBUG), upstream)
    body_of(broker, "https://api.example.com/v1/items")
    with pytest.raises(ResponseRefused, match="body carries the injected credential"):
        body_of(broker, "https://api.example.com/debug/last")


def test_other_hosts_and_a_missing_sibling_credential_leave_a_plain_rule_alone() -> None:
    upstream = RememberingUpstream()
    other = EgressRule("other.example.com", path_prefixes=("/debug/",))
    broker, decisions = broker_for((KEYED, DEBUG, other), upstream)
    body_of(broker, "https://api.example.com/v1/items")
    # The same fake answers for another host, where no rule injects anything: its answers
    # stream unchecked, at no cost (what it says is its own business).
    assert find_leaks(body_of(broker, "https://other.example.com/debug/last"), [SECRET])
    # A credential that is not there was never injected: the plain rule still works.
    broker, decisions = broker_for((KEYED, DEBUG), RememberingUpstream(), with_secret=False)
    assert body_of(broker, "https://api.example.com/debug/last") == b"{}"
    assert [d.verdict for d in decisions] == ["allowed"]


# The cost of a check. '%\\' repeated makes every '%' a lone one and every backslash a broken
# escape: the decoders' slow path, ~0.25 µs a byte in calls that keep the GIL. A 1 MiB request
# body held the event loop 0.7 s, an 8 MiB answer took 8 s (found by a review).
CRAFTED = b"%\\" * (MAX_ESCAPES // 2 + 1)
DETECTOR = SecretDetector([SECRET])


def test_text_with_more_escapes_than_can_be_inspected_is_refused_unsent_and_unread() -> None:
    with pytest.raises(PolicyDenied, match=r"request's body cannot be inspected for the rule's"):
        check_request(DETECTOR, "/v1/", "", [], CRAFTED)
    says = f"the body cannot be inspected for the injected credential \\({8 * len(CRAFTED)} '%'"
    with pytest.raises(ResponseRefused, match=says):
        checked_body(CRAFTED * 8, False, DETECTOR, 1 << 24)
    with pytest.raises(ResponseRefused, match=r"cannot be inspected .*, inside gzip"):
        checked_body(b"{" + gzip.compress(CRAFTED) + b"}", False, DETECTOR, 1 << 24)
    with pytest.raises(ResponseRefused, match="header X-Echo cannot be inspected"):
        checked_head(200, [("X-Echo", CRAFTED.decode())], DETECTOR)
    # Up to the bound the decoders run, and find the credential past the escapes.
    within = CRAFTED[: MAX_ESCAPES - 2] + SECRET.encode().hex().encode()
    with pytest.raises(ResponseRefused, match=r"carries the injected credential \(hex"):
        checked_body(within, False, DETECTOR, 1 << 24)
    # Only text counts: binary (an image) holds '%' and '\\' bytes by chance, not escapes.
    image = random.Random(7).randbytes(8 << 20)
    assert image.count(b"%") + image.count(b"\\") > MAX_ESCAPES
    assert checked_body(image, False, DETECTOR, 1 << 24) == image
    # Without a credential nothing is decoded, so nothing is refused.
    assert checked_body(CRAFTED * 8, False, SecretDetector(()), 1 << 24) == CRAFTED * 8


def _recording(monkeypatch: pytest.MonkeyPatch, names: dict[str, list[str]]) -> None:
    """Each check of services/egress.py, recording which thread ran it."""
    for name in ("check_request", "checked_head", "checked_body"):
        real = getattr(egress_service, name)

        def wrapper(*args: Any, _real: Callable[..., Any] = real, _name: str = name) -> Any:
            names.setdefault(_name, []).append(threading.current_thread().name)
            return _real(*args)

        monkeypatch.setattr(egress_service, name, wrapper)


def test_a_credential_hosts_checks_run_in_the_brokers_threads_and_a_plain_hosts_on_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """check_request ran on the event loop, checked_body in the default pool that name lookups,
    messaging and session start share (found by a review)."""
    names: dict[str, list[str]] = {}
    _recording(monkeypatch, names)
    other = EgressRule("other.example.com")
    broker, _ = broker_for((KEYED, DEBUG, other), QuietUpstream())
    body_of(broker, "https://api.example.com/v1/items")
    body_of(broker, "https://api.example.com/debug/x")
    assert all(n.startswith(CHECK_THREAD_NAME) for ran in names.values() for n in ran), names
    # Both answers are checked; only the credential rule's request is.
    assert {k: len(ran) for k, ran in names.items()} == {
        "check_request": 1, "checked_head": 2, "checked_body": 2,
    }  # fmt: skip
    # A host without a credential rule: the head's coding is read on the loop, nothing else.
    names.clear()
    body_of(broker, "https://other.example.com/x")
    assert names == {"checked_head": [threading.current_thread().name]}


class _Gate:
    """A check that waits until the test lets it go (a crafted answer's check, in effect)."""

    def __init__(self) -> None:
        self.started, self.go = threading.Event(), threading.Event()

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def gated(*args: Any) -> Any:
            self.started.set()
            self.go.wait(30)
            return real(*args)

        return gated


def test_a_request_cancelled_during_its_check_keeps_its_slot_until_the_check_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The slot was given back as the agent hung up while the check ran on: a session that
    cancelled each request as its check began had as many running as its rate allowed, and
    filled the default pool (found by a review)."""
    gate = _Gate()
    monkeypatch.setattr(egress_service, "checked_body", gate.wrap(checked_body))
    limits = EgressLimits(max_connections_per_session=1)
    broker, decisions = broker_for((KEYED, DEBUG), QuietUpstream(), limits=limits)

    async def fetch(url: str) -> list[Any]:
        return [e async for e in broker.fetch("sess0001", "GET", url, [], b"")]

    async def go() -> None:
        try:
            await hang_up_during_the_check()
        finally:
            gate.go.set()

    async def hang_up_during_the_check() -> None:
        first = asyncio.create_task(fetch("https://api.example.com/v1/items"))
        await asyncio.get_running_loop().run_in_executor(None, gate.started.wait, 30)
        first.cancel()  # the agent hangs up while its check runs
        for _ in range(50):  # the cancellation is delivered (a handful of turns)
            await asyncio.sleep(0)
        assert not first.done()  # it waits for its check
        with pytest.raises(BudgetExceeded, match="1 requests already in flight"):
            await fetch("https://api.example.com/debug/x")
        gate.go.set()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        assert first.cancelled()
        assert await fetch("https://api.example.com/debug/x")  # the slot is back

    asyncio.run(go())
    assert [d.verdict for d in decisions] == ["denied", "allowed", "allowed"]
    assert "already in flight" in decisions[0].reason
    assert decisions[1].reason == "aborted: CancelledError"
