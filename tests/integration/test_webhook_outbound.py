"""The webhook channel's outbound delivery for real (issue 15): ``WebhookChannel.deliver`` over
``services/webhook_delivery.py``, the real resolver and ``net/http.py``'s pinned client, in a
network namespace this test makes (tests/integration/webhook_support.py): a receiver on an
address ``internal_cidrs`` opens gets the reply signed; loopback, a private address and the
metadata address are refused by the egress broker's rules while canaries listen there."""

from __future__ import annotations

import ipaddress
import json
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
import pytest

from ironclawd.domain.channels import endpoint_event_id
from ironclawd.domain.egress import EgressLimits
from ironclawd.errors import ChannelFailed
from ironclawd.formats.webhook_sig import DELIVERY_HEADER, HEADER, sign, verify
from ironclawd.host.clock import SystemClock
from ironclawd.host.webhook import WebhookChannel
from ironclawd.net.http import PinnedHttpClient
from ironclawd.net.resolver import SystemResolver
from ironclawd.ports.channels import OutboundReply
from ironclawd.services.webhook_delivery import DeliveryDecision, WebhookDelivery
from tests.contract.channel_contract import check_contract
from tests.integration.webhook_support import CONFIG, SECRETS, Recorder, run_in_netns, secret

pytestmark = pytest.mark.integration


RECEIVER = "192.0.2.1"  # TEST-NET-1, on a link of the test's own netns


def reply(url: str, delivery_id: str = "sid1-7") -> OutboundReply:
    return OutboundReply(delivery_id=delivery_id, channel="hooks", where="github",
                         thread="th-1", in_reply_to_event="ev-1", text="the reply \u202e",
                         reply_url=url)  # fmt: skip


def outbound(
    scenario: Callable[[WebhookChannel, Recorder], Coroutine[Any, Any, None]],
) -> list[DeliveryDecision]:
    """Run ``scenario`` in a netns of this test's: a receiver on 192.0.2.1:8080 (opened by
    ``internal_cidrs``), canaries where a refused delivery would land (loopback, 10.0.0.1, the
    metadata address), and a WebhookChannel whose sender is the real WebhookDelivery over the
    real resolver and PinnedHttpClient. Returns the audited decisions."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a network namespace")
    decisions: list[DeliveryDecision] = []

    async def main() -> None:
        recorder = Recorder()
        for host, port in ((RECEIVER, 8080), ("127.0.0.1", 8080), ("10.0.0.1", 8080),
                           ("169.254.169.254", 80)):  # fmt: skip
            await recorder.listen(host, port)
        limits = EgressLimits(internal_cidrs=(ipaddress.ip_network("192.0.2.0/24"),),
                              timeout_seconds=10, connect_timeout_seconds=5)  # fmt: skip
        clock = SystemClock()
        sender = WebhookDelivery(resolver=SystemResolver(), upstream=PinnedHttpClient(),
                                 limits=limits, clock=clock, record=decisions.append)  # fmt: skip
        channel = WebhookChannel(CONFIG, secret, clock, sender)
        try:
            await scenario(channel, recorder)
        finally:
            await recorder.close()

    run_in_netns([f"{RECEIVER}/24", "10.0.0.1/32", "169.254.169.254/32"], main)
    return decisions


def test_a_reply_is_delivered_signed_to_an_allowed_receiver() -> None:
    async def scenario(channel: WebhookChannel, recorder: Recorder) -> None:
        await channel.deliver(reply(f"http://{RECEIVER}:8080/inbox?k=1"))
        (seen,) = recorder.seen
        assert (seen.listener, seen.path) == (f"{RECEIVER}:8080", "/inbox")
        assert seen.headers[DELIVERY_HEADER] == "sid1-7"
        secret = SECRETS["hook-secret-a"].encode()  # the endpoint the message came in on
        verify(secret, seen.headers[HEADER], seen.body, time.time(), 60)
        assert json.loads(seen.body) == {"delivery_id": "sid1-7", "in_reply_to_event": "ev-1",
                                         "thread": "th-1", "text": "the reply \u202e"}  # fmt: skip
        assert channel.status().counters == {"delivered": 1}
        # The receiver's answer decides: 5xx/429 retryable, other 4xx final.
        for status, retryable in ((500, True), (429, True), (400, False)):
            with pytest.raises(ChannelFailed, match=str(status)) as caught:
                await channel.deliver(reply(f"http://{RECEIVER}:8080/status/{status}"))
            assert caught.value.retryable is retryable

    decisions = outbound(scenario)
    assert [(d.verdict, d.status, d.address) for d in decisions] == [
        ("delivered", 200, RECEIVER), ("failed", 500, RECEIVER), ("failed", 429, RECEIVER),
        ("failed", 400, RECEIVER),
    ]  # fmt: skip
    assert decisions[0].delivery_id == "sid1-7"
    assert decisions[0].path == "/inbox"  # never the query, never the body


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("http://127.0.0.1:8080/x", "loopback"),
        ("http://localhost:8080/x", "loopback"),  # a name resolving to loopback (/etc/hosts)
        ("http://10.0.0.1:8080/x", "private"),
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
    ],
)
def test_a_reply_to_a_private_address_is_refused_by_the_brokers_rules(url: str, named: str) -> None:
    async def scenario(channel: WebhookChannel, recorder: Recorder) -> None:
        with pytest.raises(ChannelFailed, match=named) as caught:
            await channel.deliver(reply(url))
        assert caught.value.retryable is False
        assert recorder.seen == []  # the canary listening there saw nothing
        assert channel.status().counters == {"delivery_failed": 1}
        assert named in channel.status().last_error

    decisions = outbound(scenario)
    assert [d.verdict for d in decisions] == ["refused"]


class WebhookPeer:
    """A service POSTing signed webhooks to the channel (retrying, with the same signed request,
    what was not acknowledged) and receiving its replies at ``reply_url``, de-duplicated by
    ``X-Ironclaw-Delivery-Id`` as the protocol asks of a receiver."""

    where = sender = "github"
    reply_url = f"http://{RECEIVER}:8080/replies"

    def __init__(self, channel: WebhookChannel, recorder: Recorder) -> None:
        self._channel = channel
        self._recorder = recorder
        self._sent = 0

    async def send(self, text: str) -> str:
        """Send ``text``; the id the channel names the event by (its endpoint's: another
        endpoint may send the same ids)."""
        self._sent += 1
        event_id = f"ev-{self._sent}"
        body = json.dumps({"event_id": event_id, "text": text}).encode()
        headers = {HEADER: sign(SECRETS["hook-secret-a"].encode(), int(time.time()), body)}
        url = f"http://{self._channel.bound}/hooks/{self.where}"
        async with aiohttp.ClientSession() as session:
            for _ in range(5):
                async with session.post(url, data=body, headers=headers) as response:
                    if response.status == 200:
                        return endpoint_event_id(self.where, event_id)
                    assert response.status == 503, await response.text()
        raise AssertionError(f"{event_id} was not acknowledged in 5 tries")

    async def shown(self) -> list[str]:
        replies: dict[str, str] = {}
        for seen in self._recorder.seen:
            verify(SECRETS["hook-secret-a"].encode(), seen.headers[HEADER], seen.body,
                   time.time(), 60)  # fmt: skip
            replies.setdefault(seen.headers[DELIVERY_HEADER], json.loads(seen.body)["text"])
        return list(replies.values())


def test_the_webhook_channel_keeps_the_channel_contract() -> None:
    async def scenario(channel: WebhookChannel, recorder: Recorder) -> None:
        await check_contract(channel, WebhookPeer(channel, recorder))
        assert len(recorder.seen) == 3  # sent twice, shown once: the receiver de-duplicates

    decisions = outbound(scenario)
    assert [d.verdict for d in decisions] == ["delivered"] * 3
