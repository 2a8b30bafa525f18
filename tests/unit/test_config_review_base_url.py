"""``agents.NAME.base_url`` is where the model proxy sends the agent's provider key: it was
taken if it began with ``http://`` or ``https://``, so a plain-http remote host (the key sent
in clear), a URL with no host, with a password, a query or a space in it passed
--check-config and failed, or leaked, only at the first model call (found by a review)."""

from __future__ import annotations

import json

import pytest

from ironclawd.config import parse_config
from ironclawd.errors import ConfigError


def _agent(url: str) -> str:
    # A TOML basic string: JSON's escapes are TOML's, so a newline reaches the parser as one.
    return f"[agents.x]\nprovider = 'openai'\ncredential = 'openai'\nbase_url = {json.dumps(url)}\n"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://api.example.com/v1", "http:// only for a loopback"),
        ("http://10.0.0.5:8000", "http:// only for a loopback"),
        ("https://", "with a host"),
        ("https:///v1", "with a host"),
        ("https://user:pw@api.example.com", "without user or password"),
        ("https://api.example.com/v1?key=1", "without query or fragment"),
        ("https://api.example.com/v1#top", "without query or fragment"),
        ("https://api.example .com", "without spaces or control characters"),
        ("https://api.example.com/v1\n", "without spaces or control characters"),
        ("https://api.example.com:99999", "port from 1 to 65535"),
        ("https://api.example.com:0", "port from 1 to 65535"),
        ("ftp://api.example.com", "https:// URL"),
    ],
)
def test_a_base_url_that_cannot_work_or_leaks_the_key_is_refused(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match=r"'agents\.x\.base_url': expected ") as caught:
        parse_config(_agent(url), "t.toml")
    assert why in str(caught.value)


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("https://api.example.com/v1/", "https://api.example.com/v1"),
        ("https://10.0.0.5:8443", "https://10.0.0.5:8443"),
        ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/v1"),
        ("http://localhost:11434", "http://localhost:11434"),
        ("http://[::1]:8000", "http://[::1]:8000"),
    ],
)
def test_https_and_loopback_http_base_urls_are_taken(url: str, kept: str) -> None:
    (agent,) = parse_config(_agent(url), "t.toml").agents
    assert agent.base_url == kept
