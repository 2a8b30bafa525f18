"""The signed-webhook channel for real (issue 15): ``host/webhook.py`` listening on loopback (and
on a Unix socket), driven over real HTTP with a recording ``InboxSink``; every refusal has its
status and a JSON error, and the sink sees nothing of a refused request. Outbound delivery runs
in test_webhook_outbound.py."""

from __future__ import annotations

import asyncio
import json
import socket
import stat
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from ironclawd.domain.channels import ChannelConfig, WebhookEndpoint
from ironclawd.errors import ChannelFailed, HostError
from ironclawd.formats.webhook_sig import HEADER, sign
from ironclawd.host import webhook
from ironclawd.host.clock import SystemClock
from ironclawd.host.webhook import WebhookChannel
from ironclawd.ports.channels import Admission, InboundEvent, Receipt
from tests.integration.webhook_support import CONFIG, SECRETS, secret

pytestmark = pytest.mark.integration
T = TypeVar("T")


class RecordingSink:
    """Records what reached it; ``script`` gives the next outcomes (a Receipt or an exception)."""

    def __init__(self) -> None:
        self.events: list[InboundEvent] = []
        self.script: list[Receipt | Exception] = []

    async def receive(self, event: InboundEvent) -> Receipt:
        outcome = self.script.pop(0) if self.script else None
        if isinstance(outcome, Exception):
            raise outcome
        self.events.append(event)
        return outcome or Receipt(Admission.QUEUED, seq=len(self.events), sid="s1")

    def wired(self, channel: str) -> frozenset[str]:
        return frozenset({"github", "ci"})

    def screen(self, channel: str, where: str, sender: str) -> Admission | None:
        return None

    async def cursor(self, channel: str) -> str | None:
        return None

    async def save_cursor(self, channel: str, cursor: str) -> None:
        return None


class NoSender:
    async def post(self, **kwargs: Any) -> int:
        raise AssertionError("no delivery in the inbound tests")


class Served:
    """A started WebhookChannel on its own event loop thread."""

    def __init__(self, config: ChannelConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.sink = RecordingSink()
        self.channel = WebhookChannel(config, secret, SystemClock(), NoSender())
        self.call(self.channel.start(self.sink))

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        self.call(self.channel.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def url(self, endpoint: str) -> str:
        return f"http://{self.channel.bound}/hooks/{endpoint}"


@pytest.fixture
def serve() -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def make(**changes: Any) -> Served:
        started.append(Served(replace(CONFIG, **changes)))
        return started[-1]

    yield make
    for served in started:
        served.close()


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=30) as c:
        yield c


def envelope(event_id: str = "ev-1", text: str = "hello", **more: Any) -> bytes:
    return json.dumps({"event_id": event_id, "text": text, **more}).encode()


def signed(
    body: bytes, secret: str = SECRETS["hook-secret-a"], t: int | None = None
) -> dict[str, str]:
    return {HEADER: sign(secret.encode(), int(time.time()) if t is None else t, body)}


def refused(response: httpx.Response, status: int, *words: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    answer = response.json()
    assert set(answer) >= {"error", "expected"}, answer
    for word in words:
        assert word in answer["error"], answer
    return dict(answer)


def test_a_correctly_signed_message_reaches_the_sink(serve: Any, client: httpx.Client) -> None:
    served = serve()
    body = envelope("ev-1", "hi \u202e\x1b[31m there", thread="th-9")
    response = client.post(served.url("github"), content=body, headers=signed(body))
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "queued", "seq": 1}
    (event,) = served.sink.events
    # The inbox's id is the endpoint's own: another endpoint may send "ev-1" too.
    assert (event.channel, event.event_id, event.sender, event.where, event.thread) == (
        "hooks", "github/ev-1", "github", "github", "th-9",
    )  # fmt: skip
    assert event.text == "hi \u202e\x1b[31m there"  # kept as sent: operators see it escaped
    assert event.mentioned is False
    assert abs(event.received_at - time.time()) < 60
    assert served.channel.status().connected
    assert served.channel.status().counters == {"received": 1, "queued": 1}


def test_wrong_missing_malformed_and_stale_signatures_are_401(
    serve: Any, client: httpx.Client
) -> None:
    served = serve()
    body = envelope()
    url = served.url("github")
    cases = [
        (signed(body, secret=SECRETS["hook-secret-b"]), "mismatch"),  # another endpoint's secret
        ({}, "missing"),
        ({HEADER: "t=1,v1=zz"}, "malformed"),
        (signed(body, t=int(time.time()) - 301), "stale"),
        (signed(body, t=int(time.time()) + 400), "stale"),
        (signed(envelope("ev-1", "hellO")), "mismatch"),  # signed another body
    ]
    for headers, reason in cases:
        answer = refused(client.post(url, content=body, headers=headers), 401, reason)
        assert answer["reason"] == reason
    assert served.sink.events == []
    assert served.channel.status().counters["refused_401"] == len(cases)


def test_a_replay_is_409_and_reaches_the_sink_once(serve: Any, client: httpx.Client) -> None:
    served = serve()
    body = envelope()
    headers = signed(body)
    assert client.post(served.url("github"), content=body, headers=headers).status_code == 200
    refused(client.post(served.url("github"), content=body, headers=headers), 409, "replay")
    assert len(served.sink.events) == 1


def test_oversized_bodies_are_413_and_never_reach_the_sink(
    serve: Any, client: httpx.Client
) -> None:
    served = serve()
    url = served.url("github")
    big = envelope(text="x" * 6000)  # over 1024 + 4096
    refused(client.post(url, content=big, headers=signed(big)), 413, "bytes")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the cap holds while reading
        yield big[:3000]
        yield big[3000:]

    refused(client.post(url, content=chunks(), headers=signed(big)), 413)
    long_text = envelope(text="é" * 600)  # 1200 bytes of UTF-8: under the body cap, over the text's
    refused(client.post(url, content=long_text, headers=signed(long_text)), 413, "text")
    assert served.sink.events == []


def test_a_flood_is_429_with_retry_after(serve: Any, client: httpx.Client) -> None:
    served = serve(sender_messages_per_minute=3, channel_messages_per_minute=5)
    statuses = []
    for i in range(4):
        body = envelope(f"gh-{i}")
        statuses.append(client.post(served.url("github"), content=body, headers=signed(body)))
    assert [r.status_code for r in statuses] == [200, 200, 200, 429]
    refused(statuses[-1], 429, "endpoint", "3 messages per minute")
    assert 1 <= int(statuses[-1].headers["Retry-After"]) <= 20
    # The channel's bucket (5) is shared: the other endpoint gets two more, then 429 too.
    other = []
    for i in range(3):
        body = envelope(f"ci-{i}")
        headers = signed(body, secret=SECRETS["hook-secret-b"])
        other.append(client.post(served.url("ci"), content=body, headers=headers).status_code)
    assert other == [200, 200, 429]
    assert len(served.sink.events) == 5
    # A stranger's unsigned flood uses up nothing: refused before the buckets.
    served2 = serve(sender_messages_per_minute=1)
    for _ in range(5):
        refused(client.post(served2.url("github"), content=b"{}"), 401, "missing")
    body = envelope()
    assert client.post(served2.url("github"), content=body, headers=signed(body)).status_code == 200


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"{not json", "JSON"),
        (b'["a"]', "object"),
        (b'{"text": "hi"}', "event_id"),
        (b'{"event_id": "e1"}', "text"),
        (b'{"event_id": "e1", "text": "hi", "thread": 7}', "thread"),
        (b'{"event_id": "e1", "text": "hi", "admin": true}', "unknown field"),
        (b'{"event_id": "e1", "text": "\\udc00"}', "surrogate"),
        (b"\xc3\x28", "UTF-8"),
    ],
)
def test_malformed_bodies_are_400_naming_the_field(
    serve: Any, client: httpx.Client, body: bytes, named: str
) -> None:
    served = serve()
    answer = refused(client.post(served.url("github"), content=body, headers=signed(body)), 400)
    assert named in answer["error"]
    assert "event_id" in answer["expected"]
    assert served.sink.events == []


def test_unknown_endpoint_and_method(serve: Any, client: httpx.Client) -> None:
    served = serve()
    body = envelope()
    refused(client.post(served.url("nope"), content=body, headers=signed(body)), 404, "endpoint")
    answer = refused(client.get(served.url("github")), 405, "GET")
    assert answer["expected"] == "POST"
    refused(client.post(f"http://{served.channel.bound}/other", content=body), 404, "path")
    refused(client.put(f"http://{served.channel.bound}/hooks/github/x", content=body), 404)
    assert served.sink.events == []


@pytest.mark.parametrize(
    ("receipt", "status", "answer"),
    [
        (Receipt(Admission.DUPLICATE, seq=4), 200, {"status": "duplicate", "seq": 4}),
        (Receipt(Admission.NOT_ENGAGED), 200, {"status": "ignored"}),
        (Receipt(Admission.HELD), 202, {"status": "held"}),
        (Receipt(Admission.DROPPED, reason="not allowed"), 403,
         {"status": "dropped", "error": "not allowed"}),
        (Receipt(Admission.NOT_WIRED, reason="no agent"), 404,
         {"status": "not_wired", "error": "no agent"}),
        (Receipt(Admission.REFUSED, reason="control chars"), 400,
         {"status": "refused", "error": "control chars"}),
    ],
)  # fmt: skip
def test_each_admission_has_its_status(
    serve: Any, client: httpx.Client, receipt: Receipt, status: int, answer: dict[str, Any]
) -> None:
    served = serve()
    served.sink.script.append(receipt)
    body = envelope()
    response = client.post(served.url("github"), content=body, headers=signed(body))
    assert (response.status_code, response.json()) == (status, answer)


def test_an_inbox_failure_is_503_and_the_same_request_may_come_again(
    serve: Any, client: httpx.Client
) -> None:
    served = serve()
    served.sink.script.append(HostError("state db: disk I/O error"))
    body = envelope()
    headers = signed(body)
    refused(client.post(served.url("github"), content=body, headers=headers), 503, "disk I/O")
    assert served.sink.events == []
    assert "disk I/O" in served.channel.status().last_error
    # Nothing was acknowledged: the identical signed request is not a replay.
    assert client.post(served.url("github"), content=body, headers=headers).status_code == 200
    assert len(served.sink.events) == 1


def test_an_ipv6_listener(serve: Any, client: httpx.Client) -> None:
    served = serve(listen="[::1]:0")
    assert served.channel.bound.startswith("[::1]:")
    body = envelope()
    assert client.post(served.url("github"), content=body, headers=signed(body)).status_code == 200
    assert "listening on [::1]:" in served.channel.status().detail


def test_a_unix_socket_listener(serve: Any, tmp_path: Path) -> None:
    path = tmp_path / "hooks.sock"
    served = serve(listen=f"unix:{path}")
    mode = path.lstat().st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600
    body = envelope()
    transport = httpx.HTTPTransport(uds=str(path))
    with httpx.Client(transport=transport, trust_env=False, timeout=30) as c:
        response = c.post("http://hooks/hooks/github", content=body, headers=signed(body))
        assert response.status_code == 200, response.text
        refused(c.post("http://hooks/hooks/github", content=body), 401, "missing")
    assert len(served.sink.events) == 1
    served.call(served.channel.stop())
    assert not path.exists()


def test_a_short_or_missing_secret_is_never_used(serve: Any, client: httpx.Client) -> None:
    served = serve(endpoints=(WebhookEndpoint("weak", "short"), WebhookEndpoint("gone", "nope")))
    SECRETS["short"] = ""  # an empty key: anyone could sign with it
    try:
        body = envelope()
        for name, key in (("gone", "x" * 40), ("weak", "")):
            response = client.post(served.url(name), content=body, headers=signed(body, key))
            refused(response, 503, "secret")
        assert "expected 32+" in served.channel.status().last_error
        with pytest.raises(ChannelFailed, match="expected 32"):
            served.call(served.channel.test())
    finally:
        del SECRETS["short"]
    assert served.sink.events == []
    assert "2 endpoint(s)" in served.call(serve().channel.test())


def test_a_trickled_body_is_cut_off(serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webhook, "BODY_SECONDS", 0.5)
    served = serve()
    host, port = served.channel.bound.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /hooks/github HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        answer = sock.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 408"), answer
    assert '"error": "the body did not arrive within 0.5 s"' in answer
    assert served.sink.events == []
