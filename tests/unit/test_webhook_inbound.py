"""domain/webhook_inbound.py: the listen address, the message envelope (every refusal names the
field), the token buckets and the replay cache, with a hand-driven clock."""

from __future__ import annotations

import json

import pytest

from ironclawd.domain.webhook_inbound import (
    MAX_REPLAY_KEYS,
    Envelope,
    Listen,
    ReplayCache,
    TokenBucket,
    parse_envelope,
    parse_listen,
)
from ironclawd.errors import InvalidArgument
from tests.fakes.clock import FakeClock


@pytest.mark.parametrize(
    ("text", "listen"),
    [
        ("127.0.0.1:8787", Listen(host="127.0.0.1", port=8787)),
        ("[::1]:0", Listen(host="::1", port=0)),
        ("unix:/run/ironclaw/hooks.sock", Listen(path="/run/ironclaw/hooks.sock")),
    ],
)
def test_listen_forms(text: str, listen: Listen) -> None:
    assert parse_listen(text) == listen
    assert str(listen) == text


@pytest.mark.parametrize(
    "text",
    ["", "8787", "127.0.0.1", "127.0.0.1:x", ":80", "h:70000", "unix:rel", "unix:/" + "a" * 120],
)
def test_bad_listen_is_refused(text: str) -> None:
    with pytest.raises(InvalidArgument, match="listen"):
        parse_listen(text)


def test_an_envelope_is_taken_as_sent() -> None:
    body = json.dumps({"event_id": "ev-1", "text": "hi \u202e\x1b[31m", "thread": "t"}).encode()
    assert parse_envelope(body) == Envelope("ev-1", "hi \u202e\x1b[31m", "t")
    assert parse_envelope(b'{"event_id": "e", "text": "x"}').thread == ""


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"\xff\xfe", "UTF-8 JSON"),
        (b"{", "UTF-8 JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"event_id": "e", "text": "x", "x": 1}', "unknown field"),
        (b'{"event_id": "e", "event_id": "f", "text": "x"}', "repeated key"),
        (b'{"text": "x"}', "event_id"),
        (b'{"event_id": "", "text": "x"}', "event_id"),
        (b'{"event_id": "a b", "text": "x"}', "event_id"),
        (b'{"event_id": 5, "text": "x"}', "event_id"),
        (json.dumps({"event_id": "e" * 129, "text": "x"}).encode(), "event_id"),
        (b'{"event_id": "e"}', "text"),
        (b'{"event_id": "e", "text": ""}', "text"),
        (b'{"event_id": "e", "text": ["x"]}', "text"),
        (b'{"event_id": "e", "text": "\\ud800"}', "surrogate"),
        (b'{"event_id": "e", "text": "x", "thread": 1}', "thread"),
        (b'{"event_id": "e", "text": "x", "thread": "\\n"}', "thread"),
    ],
)
def test_bad_envelopes_name_what_is_wrong(body: bytes, named: str) -> None:
    with pytest.raises(InvalidArgument, match=named):
        parse_envelope(body)


def test_bucket_allows_a_minutes_burst_then_refills() -> None:
    clock = FakeClock()
    bucket = TokenBucket(clock.monotonic, 3)
    for _ in range(3):
        assert bucket.wait() == 0
        bucket.take()
    assert bucket.wait() == pytest.approx(20.0)
    clock.advance(20)
    assert bucket.wait() == 0


def test_replay_cache_forgets_after_twice_the_window() -> None:
    clock = FakeClock()
    cache = ReplayCache(clock.monotonic, 300)
    cache.add("a")
    clock.advance(599)
    assert "a" in cache
    clock.advance(2)
    assert "a" not in cache
    cache.add("b")
    cache.discard("b")
    assert "b" not in cache


def test_replay_cache_is_bounded() -> None:
    clock = FakeClock()
    cache = ReplayCache(clock.monotonic, 300)
    for i in range(MAX_REPLAY_KEYS + 5):
        cache.add(str(i))
    assert "0" not in cache
    assert str(MAX_REPLAY_KEYS + 4) in cache
