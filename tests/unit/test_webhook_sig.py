"""formats/webhook_sig.py: the HMAC-SHA256 signature of signed webhooks. Property tests: a
signature verifies only for the exact body, timestamp and secret it was made with, and only
within the window (either side of now); every refusal names its reason."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ironclawd.errors import SignatureError, Unauthenticated
from ironclawd.formats import webhook_sig
from ironclawd.formats.webhook_sig import sign, verify

WINDOW = 300.0
secrets_ = st.binary(min_size=1, max_size=64)
bodies = st.binary(max_size=2048)
times = st.integers(min_value=0, max_value=10**11)


def reason_of(secret: bytes, header: str | None, body: bytes, now: float) -> str:
    with pytest.raises(SignatureError) as caught:
        verify(secret, header, body, now, WINDOW)
    assert isinstance(caught.value, Unauthenticated)
    return caught.value.reason


def test_the_header_is_hmac_sha256_of_t_dot_body() -> None:
    secret, body = b"k" * 32, b'{"event_id": "1", "text": "hi"}'
    digest = hmac.new(secret, b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign(secret, 1700000000, body) == f"t=1700000000,v1={digest}"


@given(secrets_, times, bodies, st.floats(min_value=-WINDOW, max_value=WINDOW))
def test_a_fresh_signature_verifies(secret: bytes, t: int, body: bytes, skew: float) -> None:
    assert verify(secret, sign(secret, t, body), body, t + skew, WINDOW) == t


@given(secrets_, times, bodies, bodies)
def test_any_other_body_fails(secret: bytes, t: int, body: bytes, other: bytes) -> None:
    assume(other != body)
    assert reason_of(secret, sign(secret, t, body), other, t) == "mismatch"


@given(secrets_, times, bodies, st.integers(0, 2047), st.integers(0, 7))
def test_a_flipped_bit_fails(secret: bytes, t: int, body: bytes, at: int, bit: int) -> None:
    assume(body)
    i = at % len(body)
    flipped = body[:i] + bytes([body[i] ^ (1 << bit)]) + body[i + 1 :]
    assert reason_of(secret, sign(secret, t, body), flipped, t) == "mismatch"


@given(secrets_, times, bodies, st.integers(min_value=1, max_value=100))
def test_another_timestamp_fails(secret: bytes, t: int, body: bytes, shift: int) -> None:
    header = sign(secret, t, body).replace(f"t={t},", f"t={t + shift},")
    assert reason_of(secret, header, body, t + shift) == "mismatch"


@given(secrets_, secrets_, times, bodies)
def test_another_secret_fails(secret: bytes, other: bytes, t: int, body: bytes) -> None:
    # HMAC pads short keys with zeros: b"k" and b"k\0" are the same key by construction.
    assume(other.rstrip(b"\0") != secret.rstrip(b"\0"))
    assert reason_of(other, sign(secret, t, body), body, t) == "mismatch"


@given(secrets_, times, bodies, st.floats(min_value=WINDOW + 0.001, max_value=10**9))
def test_old_and_future_timestamps_are_stale(
    secret: bytes, t: int, body: bytes, skew: float
) -> None:
    header = sign(secret, t, body)
    assert reason_of(secret, header, body, t + skew) == "stale"
    assert reason_of(secret, header, body, t - skew) == "stale"


@pytest.mark.parametrize("header", [None, "", "   "])
def test_no_header_is_missing(header: str | None) -> None:
    assert reason_of(b"k", header, b"", 0) == "missing"


@pytest.mark.parametrize(
    "header",
    [
        "v1=" + "0" * 64,  # no t
        "t=5",  # no v1
        "t=5,v1=" + "0" * 63,  # short
        "t=5,v1=" + "A" * 64,  # upper case
        "t=-5,v1=" + "0" * 64,
        "t=5,t=6,v1=" + "0" * 64,  # two t
        "t=5;v1=" + "0" * 64,
        "t=1e3,v1=" + "0" * 64,
        "t=5,v1=" + "0" * 64 + ",junk",
        "t=5," + ",".join(["v1=" + "0" * 64] * 5),  # more than 4 candidates
        "t=5,v1=" + "0" * 600,
    ],
)
def test_malformed_headers_are_named(header: str) -> None:
    assert reason_of(b"k", header, b"", 5) == "malformed"


def test_any_one_of_several_v1_matching_is_enough() -> None:
    body, t = b"x", 100
    good = sign(b"new", t, body).split("v1=")[1]
    header = f"t={t},v1={'0' * 64},v1={good},v2=ignored"
    assert verify(b"new", header, body, t, WINDOW) == t


def test_a_forged_signature_is_mismatch_not_stale() -> None:
    """A stranger learns nothing about the clock: the MAC is checked before the time."""
    assert reason_of(b"k", "t=1,v1=" + "0" * 64, b"", 10**9) == "mismatch"


@pytest.mark.parametrize("matching", [0, 1, 3, None])
def test_every_candidate_is_compared_in_constant_time(
    monkeypatch: pytest.MonkeyPatch, matching: int | None
) -> None:
    """Each v1 goes through hmac.compare_digest, the matching one wherever it stands and every
    one after it: no ``==`` (whose time says how many leading characters were right) and no
    early exit (whose time says which candidate matched)."""
    secret, body, t = b"k" * 32, b"payload", 100
    good = webhook_sig.mac(secret, t, body)
    candidates = [f"{i:x}" * 64 for i in range(4)]
    if matching is not None:
        candidates[matching] = good
    compared: list[tuple[object, object]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr("ironclawd.formats.webhook_sig.hmac.compare_digest", recording)
    header = f"t={t}," + ",".join(f"v1={c}" for c in candidates)
    if matching is None:
        assert reason_of(secret, header, body, t) == "mismatch"
    else:
        assert verify(secret, header, body, t, WINDOW) == t
    assert compared == [(good.encode(), c.encode()) for c in candidates]
