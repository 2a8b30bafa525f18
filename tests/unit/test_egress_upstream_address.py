"""An upstream that cannot be reached: the agent was told the address its host resolved to
(``net/http.py``, "host (10.1.2.3): ConnectError ..."). The broker keeps internal answers of a
name from the agent (only an operator's ``internal_cidrs`` lets one through at all), and a
failure named it anyway. The agent is told the host it asked for; the audit keeps the
address."""

from __future__ import annotations

import asyncio
import socket

import pytest

from ironclawd.errors import UpstreamFailed
from ironclawd.net.http import PinnedHttpClient
from ironclawd.ports import UpstreamRequest


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_refused_connection_names_the_host_to_the_agent_and_the_address_to_the_audit() -> None:
    request = UpstreamRequest(
        scheme="http", host="api.example.test", address="127.0.0.1", port=closed_port(),
        method="GET", target="/", headers=(("Host", "api.example.test"),), body=b"",
        connect_timeout=5.0,
    )  # fmt: skip
    with pytest.raises(UpstreamFailed) as failed:
        asyncio.run(PinnedHttpClient().send(request))
    told = str(failed.value)
    assert told.startswith("api.example.test: ConnectError"), told
    assert "127.0.0.1" not in told
    assert failed.value.audit.startswith("api.example.test (127.0.0.1): ConnectError")


def test_an_error_made_without_an_audit_text_keeps_its_message_for_the_audit() -> None:
    assert UpstreamFailed("resolving x: no addresses").audit == "resolving x: no addresses"
