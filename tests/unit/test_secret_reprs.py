"""Objects that carry a secret never print it: a repr ends up in a debug line, an assertion's
message, an f-string someone adds later. A dataclass prints every field by default, so a field
that can hold a secret is ``repr=False``."""

from __future__ import annotations

from ironclawd.domain.egress import parse_url, prepare_headers
from ironclawd.formats import minisign
from ironclawd.ports import UpstreamRequest
from ironclawd.store.keys import MasterKey

CANARY = "sk-canary-5f0c2a9e71d4b3a8"


def test_a_request_with_an_injected_credential_does_not_print_it() -> None:
    """The broker's prepared headers and the request built from them held the credential a
    rule injects (egress.py), and their reprs showed it whole."""
    target = parse_url("https://api.example.com/v1/")
    injected = ("Authorization", f"Bearer {CANARY}")
    prepared = prepare_headers([("Accept", "*/*")], target, "GET", 0, injected)
    assert injected in prepared.headers
    request = UpstreamRequest(
        scheme="https", host="api.example.com", address="192.0.2.7", port=443, method="GET",
        target="/v1/", headers=prepared.headers, body=b"", connect_timeout=5.0,
    )  # fmt: skip
    for shown in (repr(prepared), str(prepared), repr(request), str(request)):
        assert CANARY not in shown
    assert "api.example.com" in repr(request)  # the rest still shows


def test_keys_do_not_print_their_secret_half() -> None:
    master = MasterKey(bytes(range(32)), "test")
    assert bytes(range(32)).hex() not in repr(master)
    secret = minisign.generate_key(seed=bytes(range(32)), key_id=bytes(8))
    assert bytes(range(32)).hex() not in repr(secret).lower()
    assert repr(bytes(range(32)))[2:-1] not in repr(secret)
