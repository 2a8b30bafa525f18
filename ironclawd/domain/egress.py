"""Egress rules and the checks on a request before the broker touches the network. Pure.

A request is parsed strictly (no userinfo, no backslashes, no dot segments, not even with ``;``
parameters, ASCII only), then matched against the agent's rules: scheme, host (exact, or an
explicit ``*.example.com``), port, method and path prefix. Nothing matches: :class:`PolicyDenied`
naming what was missing. Headers are checked (CR, LF, NUL; duplicate or conflicting framing
headers) and agent-supplied credentials are stripped; a rule may inject a host-held one instead
(then an agent header of that name, or a range request, is refused). Headers that override the
method or URL at the upstream are refused. The broker always asks for
``Accept-Encoding: identity``: it forwards no body it cannot inspect.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ironclawd import lazy_re
from ironclawd.domain.addresses import IPAddress, IPNetwork, canonical_ipv4, is_numeric_host
from ironclawd.errors import (
    InvalidArgument,
    PolicyDenied,
)

DEFAULT_PORTS = {"https": 443, "http": 80}
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Stripped from every request: the agent holds no credentials (a rule may inject one).
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key"})
# Hop-by-hop (RFC 9110 §7.6.1) and proxy headers: connection management is the broker's own.
HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "expect"}
)
FRAMING_HEADERS = frozenset({"host", "content-length", "transfer-encoding"})
# The broker asks for an uncompressed answer itself (it must read what it forwards).
ENCODING_HEADERS = frozenset({"accept-encoding"})
# On a rule that injects a credential: a partial answer to an echo would carry the credential in
# pieces, each too short to be recognised.
RANGE_HEADERS = frozenset({"range", "if-range"})
# Headers by which some upstreams take another method or URL than the request line's (Google
# APIs, Rails/Laravel/Symfony and others: method; IIS URL Rewrite, Symfony, Laravel: URL), so a
# rule's methods and path prefixes would hold for the request line alone. Refused, compared with
# '_' read as '-' (CGI and WSGI servers do).
OVERRIDE_HEADERS = frozenset(
    {"x-http-method-override", "x-http-method", "x-method-override", "x-original-url",
     "x-rewrite-url"}
)  # fmt: skip
_TOKEN = lazy_re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 §5.6.2
_LABEL = lazy_re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
_URL = lazy_re.compile(
    r"(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<authority>[^/?#]*)(?P<path>/[^?#]*)?"
    r"(?:\?(?P<query>[^#]*))?(?:#.*)?",
    re.IGNORECASE,
)
_PCT = lazy_re.compile(r"%(?![0-9A-Fa-f]{2})")
MAX_URL = 8192


@dataclass(frozen=True)
class EgressLimits:
    """The daemon-wide ``[egress]`` table: reachable internal ranges, trust anchors and caps."""

    internal_cidrs: tuple[IPNetwork, ...] = ()
    ca_file: str = ""  # extra trust: a PEM bundle used instead of the system store
    max_request_bytes: int = 1024 * 1024
    max_response_bytes: int = 8 * 1024 * 1024
    timeout_seconds: float = 30.0
    connect_timeout_seconds: float = 10.0
    requests_per_minute: int = 60  # each session
    max_connections_per_session: int = 4
    max_connections_total: int = 64


@dataclass(frozen=True)
class EgressRule:
    """One grant. ``host`` is exact or ``*.suffix`` (any name below suffix, not suffix itself)."""

    host: str
    scheme: str = "https"
    port: int = 0  # 0: the scheme's default port
    methods: tuple[str, ...] = ("GET",)
    path_prefixes: tuple[str, ...] = ("/",)
    credential: str = ""  # a host-held credential to inject (store/credentials.py)
    credential_header: str = "Authorization"
    credential_format: str = "Bearer {}"

    @property
    def effective_port(self) -> int:
        return self.port or DEFAULT_PORTS[self.scheme]

    def describe(self) -> str:
        methods = ",".join(self.methods)
        prefixes = ",".join(self.path_prefixes)
        return f"{methods} {self.scheme}://{self.host}:{self.effective_port}{{{prefixes}}}"


# Bounds on a rule someone asks for in a change (a session may): a path prefix of 1.4 MB made a
# stored change larger than the admin API's 4 MiB answer, and `ironctl change list` failed from
# then on (found by a review). Stored rules and the config's are not held to them: an agent
# approved before they existed still loads (services/registry.py).
MAX_PATH_PREFIXES = 32
MAX_PATH_PREFIX = 1024  # characters; a request's whole URL is at most MAX_URL
MAX_METHODS = len(METHODS)  # given, before duplicates are dropped


RULE_KEYS = frozenset(
    {"host", "scheme", "port", "methods", "path_prefixes", "credential", "credential_header",
     "credential_format"}
)  # fmt: skip
_RULE_HOST = lazy_re.compile(r"(\*\.)?[a-z0-9-]+(\.[a-z0-9-]+)*")


def rule_from_mapping(raw: object) -> EgressRule:
    """One rule from config or stored JSON; ValueError saying what was expected."""
    if not isinstance(raw, dict) or not set(raw) <= RULE_KEYS or "host" not in raw:
        raise ValueError("a table with 'host' and optional " + ", ".join(sorted(RULE_KEYS)))
    host = raw["host"]
    if not isinstance(host, str) or not _RULE_HOST.fullmatch(host) or host != host.lower():
        raise ValueError("host: a lowercase DNS name, IPv4 address or '*.suffix'")
    if host.startswith("*.") and "." not in host[2:]:
        raise ValueError("host: a wildcard needs at least two labels after '*.'")
    scheme = raw.get("scheme", "https")
    if not isinstance(scheme, str) or scheme not in DEFAULT_PORTS:
        raise ValueError("scheme: 'https' or 'http'")
    port = raw.get("port", 0)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError("port: 1-65535 (0: the scheme's default)")
    raw_methods = raw.get("methods", ["GET"])
    if not isinstance(raw_methods, list) or not all(isinstance(m, str) for m in raw_methods):
        raise ValueError("methods: a list from " + ", ".join(sorted(METHODS)))
    methods = tuple(m.upper() for m in raw_methods)
    if not methods or not set(methods) <= METHODS:
        raise ValueError("methods: a list from " + ", ".join(sorted(METHODS)))
    raw_prefixes = raw.get("path_prefixes", ["/"])
    prefixes = tuple(raw_prefixes) if isinstance(raw_prefixes, list) else ()
    if not prefixes or not all(isinstance(p, str) and p.startswith("/") for p in prefixes):
        raise ValueError("path_prefixes: a list of paths starting with '/'")
    text = {k: raw.get(k, getattr(EgressRule, k)) for k in
            ("credential", "credential_header", "credential_format")}  # fmt: skip
    if not all(isinstance(v, str) and "\r" not in v and "\n" not in v for v in text.values()):
        raise ValueError("credential, credential_header, credential_format: strings")
    if text["credential"] and "{}" not in text["credential_format"]:
        raise ValueError("credential_format: must contain '{}' where the credential goes")
    return EgressRule(host, scheme, port, methods, prefixes, **text)


def requested_rule(raw: object) -> EgressRule:
    """One rule asked for in a change: :func:`rule_from_mapping`'s checks, at most
    ``MAX_METHODS`` methods (duplicates dropped, the first kept in place) and ``MAX_PATH_PREFIXES``
    path prefixes of at most ``MAX_PATH_PREFIX`` characters; ValueError saying what was
    expected and what was given."""
    if isinstance(raw, dict):
        methods, prefixes = raw.get("methods"), raw.get("path_prefixes")
        if isinstance(methods, list) and len(methods) > MAX_METHODS:
            raise ValueError(f"methods: at most {MAX_METHODS} methods, got {len(methods)}")
        if isinstance(prefixes, list) and len(prefixes) > MAX_PATH_PREFIXES:
            raise ValueError(
                f"path_prefixes: at most {MAX_PATH_PREFIXES} paths, got {len(prefixes)}"
            )
        for index, prefix in enumerate(prefixes if isinstance(prefixes, list) else ()):
            if isinstance(prefix, str) and len(prefix) > MAX_PATH_PREFIX:
                raise ValueError(
                    f"path_prefixes[{index}]: a path of at most {MAX_PATH_PREFIX} characters, "
                    f"got one of {len(prefix)}"
                )
    rule = rule_from_mapping(raw)
    return dataclasses.replace(rule, methods=tuple(dict.fromkeys(rule.methods)))


@dataclass(frozen=True)
class Target:
    """A parsed request URL. ``address`` is set when the host is an IP literal."""

    scheme: str
    host: str
    port: int
    path: str
    query: str
    address: IPAddress | None = None

    @property
    def authority(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return shown if self.port == DEFAULT_PORTS[self.scheme] else f"{shown}:{self.port}"

    @property
    def request_target(self) -> str:
        return self.path + (f"?{self.query}" if self.query else "")


def parse_url(url: str) -> Target:
    """Parse ``url`` strictly; InvalidArgument (or PolicyDenied for numeric tricks) naming why."""
    if len(url) > MAX_URL or not url.isascii() or any(c <= " " or c == "\x7f" for c in url):
        raise InvalidArgument("url: expected printable ASCII without spaces (punycode hosts)")
    if "\\" in url:
        raise InvalidArgument("url: backslashes are not allowed")
    m = _URL.fullmatch(url)
    if m is None:
        raise InvalidArgument(f"url {url!r}: expected scheme://host[:port]/path[?query]")
    scheme = m["scheme"].lower()
    if not isinstance(scheme, str) or scheme not in DEFAULT_PORTS:
        raise PolicyDenied(f"url: scheme '{scheme}' is not served (only https, or http if granted)")
    authority = m["authority"]
    if "@" in authority:
        raise InvalidArgument("url: userinfo (user@host) is not allowed; credentials are host-held")
    host, port = _split_authority(authority, DEFAULT_PORTS[scheme])
    path = m["path"] or "/"
    query = m["query"] or ""
    _check_path(path)
    if _PCT.search(query):
        raise InvalidArgument("url: malformed percent-encoding in the query")
    address: IPAddress | None = None
    if host.startswith("["):
        address = _ipv6_literal(host)
        host = str(address)
    elif is_numeric_host(host):
        v4 = canonical_ipv4(host)
        if v4 is None:
            raise PolicyDenied(
                f"url: host '{host}' is a non-canonical numeric address (decimal, hex, octal or "
                "short forms are refused; write a.b.c.d)"
            )
        address = v4
    else:
        host = _check_hostname(host)
    return Target(scheme, host, port, path, query, address)


def _split_authority(authority: str, default_port: int) -> tuple[str, int]:
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise InvalidArgument("url: unterminated IPv6 literal")
        host, rest = authority[: end + 1], authority[end + 1 :]
        if rest and not rest.startswith(":"):
            raise InvalidArgument("url: junk after the IPv6 literal")
        port_text = rest[1:] if rest else None
    else:
        host, sep, port_text_raw = authority.partition(":")
        port_text = port_text_raw if sep else None
    if not host:
        raise InvalidArgument("url: empty host")
    if port_text is None:
        return host, default_port
    if not port_text.isdigit() or not port_text.isascii() or len(port_text) > 5:
        raise InvalidArgument(f"url: port {port_text!r}: expected 1-65535")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise InvalidArgument(f"url: port {port}: expected 1-65535")
    return host, port


def _ipv6_literal(host: str) -> IPAddress:
    inner = host[1:-1]
    if "%" in inner:
        raise PolicyDenied("url: IPv6 zone identifiers are refused")
    try:
        return ipaddress.IPv6Address(inner)
    except ValueError:
        raise InvalidArgument(f"url: {host} is not an IPv6 address") from None


def _check_hostname(host: str) -> str:
    name = host.lower()
    name = name[:-1] if name.endswith(".") else name
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise InvalidArgument(f"url: host {host!r}: expected a DNS name of [a-z0-9-] labels")
    return name


def _check_path(path: str) -> None:
    if _PCT.search(path):
        raise InvalidArgument("url: malformed percent-encoding in the path")
    lowered = path.lower()
    if "%2f" in lowered or "%5c" in lowered or "%00" in lowered:
        raise InvalidArgument("url: encoded '/', '\\' or NUL in the path is refused")
    for segment in lowered.split("/"):
        # Tomcat, Jetty and Spring drop a segment's ';' parameters before they resolve dot
        # segments: '/public/..;x=1/admin' is /admin to them (so is an encoded ';' to some).
        bare = segment.replace("%3b", ";").partition(";")[0]
        if bare.replace("%2e", ".") in (".", ".."):
            raise InvalidArgument(
                "url: dot segments ('.', '..', also with ';' parameters) in the path are refused"
            )


def host_matches(pattern: str, host: str) -> bool:
    if pattern.startswith("*."):
        suffix = pattern[1:]
        return host.endswith(suffix) and len(host) > len(suffix)
    return host == pattern


def credential_rules_on(rules: Sequence[EgressRule], host: str) -> tuple[EgressRule, ...]:
    """The rules that inject a credential into requests to ``host`` (any scheme, port, method
    or path): what an upstream there keeps of one request (a request log, a debug endpoint)
    it can hand back through any other rule on the same host."""
    return tuple(r for r in rules if r.credential and host_matches(r.host, host))


def path_matches(prefix: str, path: str) -> bool:
    """Prefix match on whole segments: '/v1' covers '/v1' and '/v1/x', never '/v10'."""
    if prefix.endswith("/"):
        return path.startswith(prefix) or path == prefix[:-1]
    return path == prefix or path.startswith(prefix + "/")


def match_rule(rules: Sequence[EgressRule], method: str, target: Target) -> EgressRule:
    """The first rule that grants this request; PolicyDenied naming what no rule granted."""
    if not rules:
        raise PolicyDenied("egress: this agent has no egress grants")
    hosts = [r for r in rules if host_matches(r.host, target.host)]
    if not hosts:
        raise PolicyDenied(f"egress: no rule for host '{target.host}'")
    schemes = [r for r in hosts if r.scheme == target.scheme]
    if not schemes:
        raise PolicyDenied(f"egress: no rule for scheme '{target.scheme}' on host '{target.host}'")
    ports = [r for r in schemes if r.effective_port == target.port]
    if not ports:
        raise PolicyDenied(
            f"egress: no rule for port {target.port} on {target.scheme}://{target.host}"
        )
    methods = [r for r in ports if method in r.methods]
    if not methods:
        raise PolicyDenied(f"egress: no rule for method {method} on {target.authority}")
    for rule in methods:
        if any(path_matches(p, target.path) for p in rule.path_prefixes):
            return rule
    raise PolicyDenied(f"egress: no rule for path '{target.path}' ({method} {target.authority})")


def check_method(method: str) -> str:
    upper = (method or "GET").upper()
    if upper not in METHODS:
        raise InvalidArgument(f"method {method!r}: expected one of {', '.join(sorted(METHODS))}")
    return upper


@dataclass(frozen=True)
class PreparedHeaders:
    # repr=False: they hold the credential a rule injects (a repr reaches logs and messages).
    headers: tuple[tuple[str, str], ...] = field(repr=False)
    stripped: tuple[str, ...]  # names of agent-supplied headers that were dropped


# What one request may carry in headers: each was checked for the credential on the event
# loop, and 140,000 small headers (3 MB, under the socket's message cap) held it 4.5 s per
# request (found by a review). Far above what any API asks for.
MAX_REQUEST_HEADERS = 100
MAX_REQUEST_HEADER_BYTES = 64 * 1024


def check_header_size(headers: Sequence[tuple[str, str]]) -> None:
    """InvalidArgument if ``headers`` are more, or larger, than a request may carry."""
    if len(headers) > MAX_REQUEST_HEADERS:
        raise InvalidArgument(
            f"headers: {len(headers)} given; expected at most {MAX_REQUEST_HEADERS}"
        )
    size = sum(len(name) + len(value) for name, value in headers)
    if size > MAX_REQUEST_HEADER_BYTES:
        raise InvalidArgument(
            f"headers: {size} bytes of names and values; expected at most "
            f"{MAX_REQUEST_HEADER_BYTES}"
        )


def prepare_headers(
    supplied: Iterable[tuple[str, str]],
    target: Target,
    method: str,
    body_length: int,
    injected: tuple[str, str] | None = None,
) -> PreparedHeaders:
    """The headers to send: checked, credentials, hop-by-hop and Accept-Encoding dropped, Host
    set from the URL, Content-Length from the body, identity asked for, a rule's credential
    added (PolicyDenied if the agent sent a header of that name, or a range, with it, or any
    of OVERRIDE_HEADERS)."""
    seen: dict[str, int] = {}
    kept: list[tuple[str, str]] = []
    stripped: list[str] = []
    for name, value in supplied:
        if not _TOKEN.fullmatch(name):
            raise InvalidArgument(f"header name {name!r}: expected an RFC 9110 token")
        if any(c in value for c in "\r\n\0"):
            raise PolicyDenied(f"header {name}: CR, LF and NUL are refused in header values")
        if not all(c == "\t" or " " <= c <= "~" for c in value):
            # httpx sends values as ASCII: anything else failed there, as an internal error.
            raise InvalidArgument(
                f"header {name}: expected visible ASCII, spaces and tabs in its value "
                "(encode anything else, e.g. as RFC 8187 or percent-encoding)"
            )
        lower = name.lower()
        seen[lower] = seen.get(lower, 0) + 1
        if lower.replace("_", "-") in OVERRIDE_HEADERS:
            raise PolicyDenied(
                f"header {name}: it overrides the method or URL at some upstreams, past the "
                "rule's methods and paths; refused (send the method and URL themselves)"
            )
        if injected is not None and lower.replace("_", "-") == injected[0].lower().replace(
            "_", "-"
        ):
            raise PolicyDenied(
                f"header {name}: this rule injects its own credential in {injected[0]}; an "
                "agent-supplied one is refused"
            )
        if injected is not None and lower in RANGE_HEADERS:
            raise PolicyDenied(
                f"header {name}: range requests are refused on a rule that injects a credential"
            )
        if lower in FRAMING_HEADERS:
            _check_framing(lower, value, seen[lower], target, body_length)
        elif (
            lower in CREDENTIAL_HEADERS
            or lower in HOP_HEADERS
            or lower in ENCODING_HEADERS
            or lower.startswith("proxy-")
        ):
            stripped.append(name)
        else:
            kept.append((name, value.strip()))
    headers = [("Host", target.authority), *kept]
    if body_length or method in ("POST", "PUT", "PATCH"):
        headers.append(("Content-Length", str(body_length)))
    headers.append(("Accept-Encoding", "identity"))
    if injected is not None:
        headers.append(injected)
    return PreparedHeaders(tuple(headers), tuple(stripped))


def _check_framing(name: str, value: str, count: int, target: Target, body_length: int) -> None:
    if count > 1:
        raise PolicyDenied(f"header {name}: duplicate framing header refused")
    if name == "transfer-encoding":
        raise PolicyDenied("header transfer-encoding: the broker frames the body itself")
    if name == "content-length" and value.strip() != str(body_length):
        raise PolicyDenied(
            f"header content-length: {value.strip()!r} does not match the body ({body_length})"
        )
    if name == "host" and value.strip().lower() not in (target.authority, target.host):
        raise PolicyDenied(f"header host: {value.strip()!r} differs from the URL's host")


@dataclass(frozen=True)
class EgressDecision:
    """One audited decision of the broker."""

    sid: str
    method: str
    host: str
    port: int
    path: str
    verdict: str  # allowed | denied | failed
    reason: str = ""
    address: str = ""
    rule: str = ""
    status: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    duration_ms: float = 0.0
    # Denied decisions of the session left out of the audit log just before this one (a box
    # decides how many it causes: at most 20 a minute are recorded).
    unrecorded_before: int = 0
