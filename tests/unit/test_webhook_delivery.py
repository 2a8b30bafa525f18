"""services/webhook_delivery.py with a scripted resolver and a recording upstream (no network):
the broker's address rules, connection only to the checked address, the signed headers, the
status mapping (2xx accepted; 3xx and 4xx but 408/429 final; the rest retryable), the audit."""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import dataclass

import pytest

from ironclawd.domain.egress import EgressLimits
from ironclawd.errors import ChannelFailed
from ironclawd.formats.webhook_sig import DELIVERY_HEADER, HEADER, verify
from ironclawd.ports import UpstreamRequest
from ironclawd.services.webhook_delivery import DeliveryDecision, WebhookDelivery
from tests.fakes.clock import FakeClock

SECRET = b"s" * 32
PUBLIC = "93.184.215.14"  # never contacted: the upstream is a fake


class Resolver:
    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    async def resolve(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        return self.answers[host]


@dataclass
class Response:
    status: int
    reason: str = "X"
    headers: tuple[tuple[str, str], ...] = ()
    closed: bool = False

    async def read_chunk(self) -> bytes:
        return b""

    async def close(self) -> None:
        self.closed = True


class Upstream:
    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.sent: list[UpstreamRequest] = []

    async def send(self, request: UpstreamRequest) -> Response:
        self.sent.append(request)
        return Response(self.status)


def make(
    status: int = 200, answers: dict[str, list[str]] | None = None, internal: tuple[str, ...] = ()
) -> tuple[WebhookDelivery, Upstream, list[DeliveryDecision], FakeClock]:
    records: list[DeliveryDecision] = []
    upstream = Upstream(status)
    clock = FakeClock()
    limits = EgressLimits(internal_cidrs=tuple(ipaddress.ip_network(c) for c in internal))
    delivery = WebhookDelivery(resolver=Resolver(answers or {"hooks.example": [PUBLIC]}),
                               upstream=upstream, limits=limits, clock=clock,
                               record=records.append)  # fmt: skip
    return delivery, upstream, records, clock


def post(delivery: WebhookDelivery, url: str = "https://hooks.example/in?x=1") -> int:
    return asyncio.run(delivery.post(channel="hooks", url=url, body=b'{"text": "hi"}',
                                     secret=SECRET, delivery_id="sid-1"))  # fmt: skip


def test_a_delivery_is_signed_and_goes_to_the_checked_address() -> None:
    delivery, upstream, records, clock = make()
    assert post(delivery) == 200
    (sent,) = upstream.sent
    assert (sent.address, sent.host, sent.port, sent.target) == (PUBLIC, "hooks.example", 443,
                                                                 "/in?x=1")  # fmt: skip
    headers = dict(sent.headers)
    assert headers[DELIVERY_HEADER] == "sid-1"
    assert headers["Host"] == "hooks.example"
    assert verify(SECRET, headers[HEADER], sent.body, clock.time(), 300) == int(clock.time())
    assert [(r.verdict, r.status, r.address, r.path) for r in records] == [
        ("delivered", 200, PUBLIC, "/in")
    ]


@pytest.mark.parametrize(
    ("url", "answers", "named"),
    [
        ("http://127.0.0.1:8080/x", {}, "loopback"),
        ("http://169.254.169.254/latest", {}, "metadata"),
        ("http://10.0.0.1/x", {}, "private"),
        ("https://hooks.example/x", {"hooks.example": ["127.0.0.1"]}, "loopback"),
        ("https://hooks.example/x", {"hooks.example": [PUBLIC, "10.1.2.3"]}, "private"),
        ("https://hooks.example/x", {"hooks.example": ["::ffff:127.0.0.1"]}, "IPv4-mapped"),
        ("http://2130706433/x", {}, "non-canonical"),
        ("https://user@hooks.example/x", {}, "userinfo"),
        ("ftp://hooks.example/x", {}, "scheme"),
    ],
)
def test_addresses_the_broker_refuses_are_refused_for_good(
    url: str, answers: dict[str, list[str]], named: str
) -> None:
    delivery, upstream, records, _ = make(answers=answers)
    with pytest.raises(ChannelFailed, match=named) as caught:
        post(delivery, url)
    assert caught.value.retryable is False
    assert upstream.sent == []
    assert [r.verdict for r in records] == ["refused"]


def test_internal_cidrs_open_a_private_range() -> None:
    delivery, upstream, _, _ = make(internal=("10.9.0.0/16",))
    assert post(delivery, "http://10.9.0.5:8080/in") == 200
    assert upstream.sent[0].address == "10.9.0.5"


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(301, False), (400, False), (401, False), (404, False), (408, True), (429, True),
     (500, True), (503, True)],
)  # fmt: skip
def test_status_mapping(status: int, retryable: bool) -> None:
    delivery, _, records, _ = make(status)
    with pytest.raises(ChannelFailed, match=str(status)) as caught:
        post(delivery)
    assert caught.value.retryable is retryable
    assert [(r.verdict, r.status) for r in records] == [("failed", status)]


def test_a_header_breaking_delivery_id_is_refused() -> None:
    delivery, upstream, _, _ = make()
    with pytest.raises(ChannelFailed, match="delivery id"):
        asyncio.run(delivery.post(channel="hooks", url="https://hooks.example/",
                                  body=b"{}", secret=SECRET, delivery_id="a\r\nX: y"))  # fmt: skip
    assert upstream.sent == []
