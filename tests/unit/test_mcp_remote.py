"""Remote MCP servers (``url``): what a URL may be, what a registration of one may carry, and the
egress broker's SSRF rules applied before any connection (host/mcp_remote.py)."""

from __future__ import annotations

import asyncio
import gzip
import ipaddress
import json
import ssl
import zlib
from typing import Any

import httpx2
import pytest

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.changes import agent_view, check_payload, parse_change
from ironclawd.domain.egress import EgressLimits
from ironclawd.domain.mcp import McpLimits, McpServer
from ironclawd.domain.mcp_url import parse_url
from ironclawd.errors import InvalidArgument, McpServerFailed, PolicyDenied
from ironclawd.host.mcp_pinned import PinnedTransport
from ironclawd.host.mcp_remote import RemoteMcpLauncher
from tests.fakes.host import FakeCredentials

REMOTE: dict[str, Any] = {
    "name": "docs",
    "url": "https://mcp.example.com:8443/mcp",
    "credentials": {"Authorization": "docs-token"},
    "tools": [{"name": "search", "description": "Search.", "input_schema": {"type": "object"}}],
}


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://mcp.example.com/mcp", r"expected https://, got http://"),
        ("ftp://mcp.example.com/", "expected https://"),
        ("https://user:pw@mcp.example.com/", "no user or password"),
        ("https://mcp.example.com:0/", "port 0 is not in 1-65535"),
        ("https://mcp.example.com:65536/", "port 65536 is not in 1-65535"),
        ("https://mcp.example.com/#x", "no fragment"),
        ("https://2130706433/", "not a dotted-quad"),
        ("https://0x7f.1/", "not a dotted-quad"),
        ("https://127.1/", "not a dotted-quad"),
        ("https://[::zz]/", "expected HOST"),
        ("https://[1::2::3]/", "not an IPv6 address"),
        ("https://exa_mple.com/", "expected HOST"),
        ("https://-bad.example/", "not a DNS name"),
        ("https://mcp.example.com/a b", "printable ASCII"),
        ("mcp.example.com/mcp", "expected https://HOST"),
        ("", "expected an https:// URL"),
    ],
)
def test_a_url_is_refused_unless_it_is_plain_https(url: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_url(url)


def test_a_url_names_its_host_port_and_target() -> None:
    endpoint = parse_url("https://MCP.Example.com/mcp?x=1")
    assert (endpoint.host, endpoint.port, endpoint.target) == ("mcp.example.com", 443, "/mcp?x=1")
    assert endpoint.address is None
    literal = parse_url("https://[2001:db8::1]:8443")
    assert (literal.host, literal.port, literal.target) == ("2001:db8::1", 8443, "/")
    assert literal.authority == "[2001:db8::1]:8443"
    assert literal.address == ipaddress.ip_address("2001:db8::1")


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"command": ["/bin/true"]}, r"remote server \(url\) has no command"),
        ({"env": {"TZ": "UTC"}}, r"remote server \(url\) has no env"),
        ({"allow": ["x.example:443"]}, r"remote server \(url\) has no allow"),
        ({"credentials": {"Host": "docs-token"}}, "Host may not carry a credential"),
        ({"credentials": {"Mcp-Session-Id": "docs-token"}}, "may not carry a credential"),
        ({"credentials": {"Bad Header": "docs-token"}}, "expected a header name"),
        ({"url": "https://u@mcp.example.com/"}, "no user or password"),
    ],
)
def test_a_remote_registration_is_refused_field_by_field(
    server: dict[str, Any], message: str
) -> None:
    payload = {"op": "register", "server": {**REMOTE, **server}}
    with pytest.raises(InvalidArgument, match=message):
        check_payload("mcp", "demo", json.dumps(payload))


def test_a_remote_registration_round_trips_shows_its_network_and_is_operator_only() -> None:
    change = parse_change("mcp", "demo", json.dumps({"op": "register", "server": REMOTE}))
    with pytest.raises(PolicyDenied, match="only come from an operator"):
        change.authorize("session:s-1")
    change.authorize("uid:0")
    again = parse_change("mcp", "demo", json.dumps(change.to_json()))
    assert again.to_json() == change.to_json()
    shown = agent_view(change.apply(AgentSpec(name="demo")))
    assert shown is not None
    view = shown["mcp_servers"][0]
    assert view["url"] == "https://mcp.example.com:8443/mcp"
    assert view["credentials"] == {"Authorization": "<host credential docs-token>"}
    assert view["network"] == ["mcp.example.com:8443 (remote, via the egress broker's rules)"]
    assert "docs-token-value" not in json.dumps(view)


class _Resolver:
    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, int]] = []

    async def resolve(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        return self.answers


def _launcher(resolver: _Resolver, records: list[dict[str, Any]], **egress: Any) -> Any:
    return RemoteMcpLauncher(
        FakeCredentials(**{"docs-token": "Bearer s3cret"}), McpLimits(), EgressLimits(**egress),
        resolver, lambda event, actor, **f: records.append({"event": event, "actor": actor, **f}),
        ssl.create_default_context,
    )  # fmt: skip


async def _open(launcher: Any, url: str) -> None:
    server = McpServer(name="docs", url=url, credentials=(("Authorization", "docs-token"),))
    async with launcher.open("demo", server):
        raise AssertionError("opened a server that must be refused")


@pytest.mark.parametrize(
    ("answers", "reason"),
    [
        (["127.0.0.1"], "127.0.0.1, a loopback address"),
        (["169.254.169.254"], "169.254.169.254, a cloud metadata address"),
        (["10.1.2.3"], "10.1.2.3, a private address"),
        (["93.184.216.34", "::1"], "::1, a loopback address"),  # one bad answer spoils the name
        (["::ffff:127.0.0.1"], "::ffff:7f00:1, a IPv4-mapped IPv6 address"),
    ],
)
def test_a_name_resolving_somewhere_the_broker_refuses_is_refused_before_connecting(
    answers: list[str], reason: str
) -> None:
    records: list[dict[str, Any]] = []
    resolver = _Resolver(*answers)
    with pytest.raises(McpServerFailed, match=f"mcp.example.com resolves to {reason}; refused"):
        asyncio.run(_open(_launcher(resolver, records), "https://mcp.example.com:8443/mcp"))
    assert resolver.asked == [("mcp.example.com", 8443)]
    # Audited, and nothing else happened: no request was made (each one is audited too).
    assert len(records) == 1
    assert records[0]["event"] == "mcp.remote"
    assert "refused" in records[0]
    assert records[0]["actor"] == "agent:demo"


def test_an_ip_literal_is_checked_too_and_internal_cidrs_open_a_private_range() -> None:
    records: list[dict[str, Any]] = []
    with pytest.raises(McpServerFailed, match=r"169\.254\.169\.254, a cloud metadata address"):
        asyncio.run(_open(_launcher(_Resolver(), records), "https://169.254.169.254/mcp"))
    # internal_cidrs opens 10.0.0.0/8 but never loopback or metadata.
    opened = (ipaddress.ip_network("10.0.0.0/8"),)
    mixed = _launcher(_Resolver("10.0.0.5", "127.0.0.1"), records, internal_cidrs=opened)
    with pytest.raises(McpServerFailed, match="loopback"):
        asyncio.run(_open(mixed, "https://mcp.example.com/"))


def test_the_transport_refuses_any_request_but_to_the_registered_origin() -> None:
    records: list[dict[str, Any]] = []
    transport = PinnedTransport(
        parse_url("https://mcp.example.com/mcp"), ipaddress.ip_address("192.0.2.7"),
        ssl.create_default_context(), 1024, lambda **f: records.append(f),
    )  # fmt: skip

    async def send(url: str) -> None:
        await transport.handle_async_request(httpx2.Request("POST", url))

    for url in ("https://127.0.0.1/mcp", "http://mcp.example.com/mcp",
                "https://mcp.example.com:444/mcp", "https://other.example.com/mcp"):  # fmt: skip
        with pytest.raises(httpx2.ConnectError, match="is not the registered server"):
            asyncio.run(send(url))
    assert [r["refused"] for r in records] == ["not the registered server"] * 4


def test_the_transport_asks_for_bodies_as_sent_and_refuses_an_encoded_one() -> None:
    """The cap counted bytes on the wire and httpx unpacked gzip after it: a 520 KB answer
    became 512 MiB in the daemon (found by a review). The transport asks for identity and
    refuses any other Content-Encoding."""
    records: list[dict[str, Any]] = []
    transport = PinnedTransport(
        parse_url("https://mcp.example.com/mcp"), ipaddress.ip_address("192.0.2.7"),
        ssl.create_default_context(), 1024, lambda **f: records.append(f),
    )  # fmt: skip
    asked: list[str] = []

    def upstream(request: httpx2.Request) -> httpx2.Response:
        asked.append(request.headers.get("Accept-Encoding", ""))
        encoding = request.url.path.rsplit("/", 1)[-1]
        if encoding == "plain":
            return httpx2.Response(200, content=b"{}")
        packed = gzip.compress(b"{}") if encoding == "gzip" else zlib.compress(b"{}")
        return httpx2.Response(200, headers={"Content-Encoding": encoding}, content=packed)

    transport._inner = httpx2.MockTransport(upstream)  # type: ignore[assignment]

    async def send(path: str) -> bytes:
        request = httpx2.Request("POST", f"https://mcp.example.com/{path}",
                                 headers={"Accept-Encoding": "gzip, deflate"})  # fmt: skip
        response = await transport.handle_async_request(request)
        return await response.aread()

    assert asyncio.run(send("plain")) == b"{}"
    for encoding in ("gzip", "deflate"):
        with pytest.raises(httpx2.RemoteProtocolError, match=f"Content-Encoding {encoding},"):
            asyncio.run(send(encoding))
    assert asked == ["identity"] * 3
    refused = [r["refused"] for r in records if "refused" in r]
    assert refused == [
        f"the server answered in Content-Encoding {e}, not as sent" for e in ("gzip", "deflate")
    ]
