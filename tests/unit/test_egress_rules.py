"""Egress rules, URL parsing and header checks (ironclawd/domain/egress.py): pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ironclawd.domain.egress import (
    MAX_REQUEST_HEADER_BYTES,
    MAX_REQUEST_HEADERS,
    EgressRule,
    check_header_size,
    check_method,
    match_rule,
    parse_url,
    path_matches,
    prepare_headers,
    rule_from_mapping,
)
from ironclawd.errors import InvalidArgument, PolicyDenied

RULES = (
    EgressRule("api.example.com", methods=("GET", "POST"), path_prefixes=("/v1/",)),
    EgressRule("*.cdn.example.net"),
    EgressRule("plain.example.org", scheme="http", port=8080),
)


def test_allowed_request_matches_its_rule() -> None:
    target = parse_url("https://api.example.com/v1/items?q=1")
    assert match_rule(RULES, "POST", target) is RULES[0]
    assert target.port == 443
    assert target.request_target == "/v1/items?q=1"
    assert match_rule(RULES, "GET", parse_url("https://a.b.cdn.example.net/x")) is RULES[1]
    assert match_rule(RULES, "GET", parse_url("http://plain.example.org:8080/")) is RULES[2]


@pytest.mark.parametrize(
    ("method", "url", "missing"),
    [
        ("GET", "https://other.example.com/v1/", "no rule for host 'other.example.com'"),
        ("GET", "https://api.example.com.evil.net/v1/", "no rule for host"),
        ("GET", "https://cdn.example.net/x", "no rule for host 'cdn.example.net'"),
        ("GET", "http://api.example.com/v1/", "no rule for scheme 'http'"),
        ("GET", "https://api.example.com:8443/v1/", "no rule for port 8443"),
        ("DELETE", "https://api.example.com/v1/x", "no rule for method DELETE"),
        ("GET", "https://api.example.com/v2/x", "no rule for path '/v2/x'"),
        ("GET", "https://api.example.com/v10/", "no rule for path '/v10/'"),
        ("GET", "https://plain.example.org:8080/", "no rule for scheme 'https'"),
        ("GET", "http://plain.example.org/", "no rule for port 80"),
    ],
)
def test_missing_rule_is_named(method: str, url: str, missing: str) -> None:
    with pytest.raises(PolicyDenied, match=missing.replace("(", r"\(").replace(".", r"\.")):
        match_rule(RULES, method, parse_url(url))


def test_no_rules_at_all_is_denied() -> None:
    with pytest.raises(PolicyDenied, match="no egress grants"):
        match_rule((), "GET", parse_url("https://api.example.com/"))


@pytest.mark.parametrize(
    "url",
    [
        "https://user:pw@api.example.com/v1/",
        "https://api.example.com\\@evil.net/",
        "https://api.example.com/v1/../admin",
        "https://api.example.com/v1/%2e%2e/admin",
        "https://api.example.com/v1/..%2fadmin",
        "https://api.example.com/v1/%00",
        "https://api.example.com/v1/ x",
        "https://api.exämple.com/",
        "https:///v1/",
        "https://api.example.com:0/",
        "https://api.example.com:99999/",
        "https://api.example.com:+443/",
        "https://-bad-.example.com/",
        "https://api.example.com/%zz",
        "https://[::1%25eth0]/",
        "not a url",
    ],
)
def test_malformed_or_tricky_urls_are_refused(url: str) -> None:
    with pytest.raises((InvalidArgument, PolicyDenied)):
        parse_url(url)


@pytest.mark.parametrize(
    "path",
    ["/v1/..;/admin/users", "/v1/%2e%2e;/admin", "/v1/..;jsessionid=x/admin", "/v1/.;/x",
     "/v1/..%3b/admin", "/v1/%2E.;a=b;c=d/admin"],
)  # fmt: skip
def test_a_dot_segment_with_path_parameters_cannot_leave_the_prefix(path: str) -> None:
    """Tomcat, Jetty and Spring drop ';' parameters before resolving dot segments, so they
    route '/v1/..;/admin' to /admin; only a segment of exactly '..' was refused and it matched
    a '/v1/' rule (found by a review)."""
    with pytest.raises(InvalidArgument, match=r"dot segments \('\.', '\.\.', also with ';'"):
        match_rule(RULES, "GET", parse_url(f"https://api.example.com{path}"))
    # Parameters and dots elsewhere in a segment stay allowed.
    for fine in ("/v1/items;v=2", "/v1/a..b;x", "/v1/...;x", "/v1/.well-known"):
        assert match_rule(RULES, "GET", parse_url(f"https://api.example.com{fine}")) is RULES[0]


@pytest.mark.parametrize("url", ["ftp://api.example.com/", "file:///etc/passwd", "gopher://x/"])
def test_other_schemes_are_denied(url: str) -> None:
    with pytest.raises((PolicyDenied, InvalidArgument)):
        parse_url(url)


@pytest.mark.parametrize(
    "host",
    ["2130706433", "0x7f000001", "0x7f.1", "0177.0.0.1", "127.1", "127.0.1", "017700000001",
     "127.0.0.01", "1.2.3.4.5", "0", "0x", "169.254.43518"],
)  # fmt: skip
def test_numeric_host_tricks_are_denied(host: str) -> None:
    with pytest.raises(PolicyDenied, match="non-canonical numeric"):
        parse_url(f"http://{host}/")


def test_canonical_ip_literals_parse_to_addresses() -> None:
    assert str(parse_url("https://198.51.100.1/").address) == "198.51.100.1"
    assert str(parse_url("https://[2001:db8::1]:8443/").address) == "2001:db8::1"
    assert parse_url("https://API.Example.COM./").host == "api.example.com"


def test_path_prefixes_match_whole_segments() -> None:
    assert path_matches("/v1", "/v1")
    assert path_matches("/v1", "/v1/x")
    assert not path_matches("/v1", "/v10")
    assert path_matches("/v1/", "/v1/x")
    assert path_matches("/v1/", "/v1")
    assert not path_matches("/v1/", "/v1x")


@given(st.text(alphabet="abc.-", min_size=1, max_size=20).filter(lambda s: not s.endswith(".")))
def test_wildcard_never_matches_the_bare_suffix_or_a_lookalike(label: str) -> None:
    rule = EgressRule("*.example.com")
    for host in ("example.com", f"{label}example.com", f"example.com.{label}"):
        try:
            target = parse_url(f"https://{host}/")
        except (InvalidArgument, PolicyDenied):
            continue
        with pytest.raises(PolicyDenied):
            match_rule((rule,), "GET", target)


def _headers(*pairs: tuple[str, str], method: str = "GET", body: int = 0) -> list[tuple[str, str]]:
    target = parse_url("https://api.example.com/v1/")
    return list(prepare_headers(pairs, target, method, body).headers)


def test_a_request_with_too_many_or_too_large_headers_is_refused() -> None:
    # Each header was checked for the credential on the event loop: 140,000 small ones (3 MB,
    # under the socket's message cap) held it 4.5 s per request (found by a review).
    check_header_size([("X-A", "v")] * MAX_REQUEST_HEADERS)
    with pytest.raises(InvalidArgument, match=f"expected at most {MAX_REQUEST_HEADERS}"):
        check_header_size([("X-A", "v")] * (MAX_REQUEST_HEADERS + 1))
    with pytest.raises(InvalidArgument, match="bytes of names and values"):
        check_header_size([("X-A", "v" * MAX_REQUEST_HEADER_BYTES)])


def test_headers_get_host_and_lose_credentials_and_hop_by_hop() -> None:
    sent = _headers(
        ("Accept", "application/json"),
        ("Authorization", "Bearer agent-made"),
        ("Cookie", "a=b"),
        ("X-Api-Key", "k"),
        ("Proxy-Authorization", "x"),
        ("Connection", "close"),
        ("Upgrade", "h2c"),
        ("Accept-Encoding", "gzip, br"),
        ("TE", "gzip"),
    )
    assert sent == [("Host", "api.example.com"), ("Accept", "application/json"),
                    ("Accept-Encoding", "identity")]  # fmt: skip


def test_injected_credential_is_added_and_other_agent_credentials_stripped() -> None:
    target = parse_url("https://api.example.com/v1/")
    prepared = prepare_headers(
        [("Cookie", "c=1"), ("Accept-Encoding", "gzip")], target, "GET", 0,
        ("X-Api-Key", "host-held"),
    )  # fmt: skip
    assert prepared.headers[-2:] == (("Accept-Encoding", "identity"), ("X-Api-Key", "host-held"))
    assert prepared.stripped == ("Cookie", "Accept-Encoding")


@pytest.mark.parametrize("name", ["Authorization", "authorization", "AUTHORIZATION"])
def test_an_agent_header_named_like_the_injected_one_is_refused_by_name(name: str) -> None:
    target = parse_url("https://api.example.com/v1/")
    with pytest.raises(PolicyDenied, match=f"header {name}: this rule injects its own"):
        prepare_headers([(name, "Bearer mine")], target, "GET", 0, ("Authorization", "Bearer h"))
    # Without an injecting rule it is only stripped, as every agent credential is.
    assert prepare_headers([(name, "x")], target, "GET", 0).stripped == (name,)


@pytest.mark.parametrize("name", ["X-Api-Key", "x-api-key", "X_API_KEY", "x_Api-key"])
def test_underscores_do_not_disguise_the_injected_header(name: str) -> None:
    # CGI and WSGI servers (and nginx with underscores_in_headers) read '_' as '-'.
    target = parse_url("https://api.example.com/v1/")
    with pytest.raises(PolicyDenied, match=f"header {name}: this rule injects its own"):
        prepare_headers([(name, "guess")], target, "GET", 0, ("X-Api-Key", "Bearer h"))


@pytest.mark.parametrize("name", ["Range", "if-range"])
def test_range_requests_are_refused_on_a_credential_rule(name: str) -> None:
    target = parse_url("https://api.example.com/v1/")
    with pytest.raises(PolicyDenied, match="range requests are refused"):
        prepare_headers([(name, "bytes=10-20")], target, "GET", 0, ("Authorization", "Bearer h"))
    assert (name, "bytes=10-20") in prepare_headers([(name, "bytes=10-20")], target, "GET",
                                                    0).headers  # fmt: skip


@pytest.mark.parametrize(
    ("name", "value"),
    [("X-HTTP-Method-Override", "DELETE"), ("X-HTTP-Method", "DELETE"),
     ("x-method-override", "PUT"), ("X-Original-URL", "/admin/users"),
     ("X-Rewrite-URL", "/admin/users"), ("X_HTTP_Method_Override", "DELETE")],
)  # fmt: skip
def test_method_and_url_override_headers_are_refused(name: str, value: str) -> None:
    """They were forwarded: a GET,POST rule under /v1/ became DELETE, or /admin, at upstreams
    that honour them (found by a review)."""
    target = parse_url("https://api.example.com/v1/items")
    assert match_rule(RULES, "POST", target) is RULES[0]
    with pytest.raises(PolicyDenied, match=f"header {name}: it overrides the method or URL"):
        prepare_headers([(name, value)], target, "POST", 0)


@pytest.mark.parametrize(
    "pairs",
    [
        (("X-A", "a\r\nX-Injected: 1"),),
        (("X-A", "a\nb"),),
        (("X-A", "a\0b"),),
        (("Host", "api.example.com"), ("Host", "evil.net")),
        (("Host", "evil.net"),),
        (("Content-Length", "0"), ("content-length", "0")),
        (("Transfer-Encoding", "chunked"),),
        (("Content-Length", "5"),),
    ],
)
def test_header_smuggling_is_denied(pairs: tuple[tuple[str, str], ...]) -> None:
    with pytest.raises(PolicyDenied):
        _headers(*pairs)


@pytest.mark.parametrize("name", ["X A", "X:A", "", "X\r\nA", "Ä"])
def test_bad_header_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument):
        _headers((name, "v"))


@pytest.mark.parametrize("value", ["café", "a\x01b", "a\x7fb", "\u2028"])
def test_header_values_that_are_not_visible_ascii_are_refused(value: str) -> None:
    """httpx sends values as ASCII: "café" failed there, as an internal error with a traceback
    in the journal (stop 47's review). Tabs and spaces stay allowed."""
    with pytest.raises(InvalidArgument, match="expected visible ASCII"):
        _headers(("X-Note", value))
    assert ("X-Note", "a\tb c~") in _headers(("X-Note", "a\tb c~"))


def test_body_methods_carry_content_length() -> None:
    assert ("Content-Length", "0") in _headers(method="POST")
    assert ("Content-Length", "3") in _headers(method="PUT", body=3)
    assert not any(k == "Content-Length" for k, _ in _headers())


def test_methods_are_checked() -> None:
    assert check_method("") == "GET"
    assert check_method("post") == "POST"
    for bad in ("CONNECT", "TRACE", "GET /", "G\r\nET"):
        with pytest.raises(InvalidArgument):
            check_method(bad)


def test_rules_from_config_are_validated() -> None:
    rule = rule_from_mapping(
        {"host": "*.example.com", "methods": ["get"], "path_prefixes": ["/a"], "port": 8443}
    )
    assert rule == EgressRule("*.example.com", port=8443, methods=("GET",), path_prefixes=("/a",))
    for bad in (
        {"host": "Example.com"},
        {"host": "*.com"},
        {"host": "a.example.com", "scheme": "ftp"},
        {"host": "a.example.com", "methods": ["CONNECT"]},
        {"host": "a.example.com", "path_prefixes": ["v1"]},
        {"host": "a.example.com", "credential": "k", "credential_format": "no slot"},
        {"host": "a.example.com", "extra": 1},
        {"scheme": "https"},
    ):
        refusal = (
            r"^(a table with 'host'|host: |scheme: |methods: |path_prefixes: |credential_format: )"
        )
        with pytest.raises(ValueError, match=refusal):
            rule_from_mapping(bad)
