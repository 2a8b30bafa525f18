"""A remote MCP server's URL, checked (docs/mcp.md "Remote servers"). Pure.

Only ``https://host[:port]/path[?query]``: TLS always (the server's answers and the credential
header travel over the network), no userinfo (a credential in a URL is shown, logged and
stored), no fragment, a host that is a DNS name, a canonical dotted-quad IPv4 or a bracketed IPv6
literal (``2130706433``, ``0x7f.1`` and ``127.1`` cannot smuggle loopback past a reader). Which
addresses the name may resolve to is decided at connect time by the egress broker's rules
(domain/addresses.py), not here.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ironclawd import lazy_re
from ironclawd.domain.addresses import canonical_ipv4, is_numeric_host
from ironclawd.errors import InvalidArgument

MAX_URL = 2048
_URL_RE = lazy_re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<authority>[^/?#]*)(?P<target>[^#]*)"
)
_AUTHORITY_RE = lazy_re.compile(
    r"(?P<host>\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9.-]{1,253})(:(?P<port>\d{1,5}))?"
)
_LABEL_RE = lazy_re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_TARGET_RE = lazy_re.compile(r"/[\x21-\x7e]*")


@dataclass(frozen=True)
class McpEndpoint:
    """Where a remote server is: ``host`` as TLS must verify it, ``port``, and the request
    target (path and query)."""

    host: str  # lower-case name, or an IP literal without brackets
    port: int
    target: str

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def address(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        """The host if it is an IP literal (nothing to resolve), else None."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None


def parse_url(raw: object) -> McpEndpoint:
    """``raw`` checked as a remote server's URL; InvalidArgument saying what is wrong."""
    where = "payload.server.url"
    if not isinstance(raw, str) or not raw or len(raw) > MAX_URL:
        raise InvalidArgument(f"{where}: expected an https:// URL of at most {MAX_URL} chars")
    match = _URL_RE.fullmatch(raw)
    if match is None or "#" in raw:
        raise InvalidArgument(
            f"{where}: expected https://HOST[:PORT]/PATH (no fragment), got {raw!r}"
        )
    if match.group("scheme").lower() != "https":
        raise InvalidArgument(
            f"{where}: expected https://, got {match.group('scheme')}:// (a remote server is "
            "reached over verified TLS only)"
        )
    authority = match.group("authority")
    if "@" in authority:
        raise InvalidArgument(
            f"{where}: no user or password in the URL (use --credential HEADER=NAME)"
        )
    parts = _AUTHORITY_RE.fullmatch(authority)
    if parts is None:
        raise InvalidArgument(f"{where}: expected HOST[:PORT] after https://, got {authority!r}")
    port = int(parts.group("port") or 443)
    if not 1 <= port <= 65535:
        raise InvalidArgument(f"{where}: port {port} is not in 1-65535")
    target = match.group("target") or "/"
    if _TARGET_RE.fullmatch(target) is None:
        raise InvalidArgument(f"{where}: the path must start with / and be printable ASCII")
    return McpEndpoint(host=_host(parts.group("host"), where), port=port, target=target)


def _host(host: str, where: str) -> str:
    if host.startswith("["):
        try:
            return str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            raise InvalidArgument(f"{where}: {host} is not an IPv6 address") from None
    host = host.lower()
    if is_numeric_host(host):
        address = canonical_ipv4(host)
        if address is None:
            raise InvalidArgument(
                f"{where}: {host!r} looks numeric but is not a dotted-quad IPv4 address"
            )
        return str(address)
    labels = host.split(".")
    if not all(_LABEL_RE.fullmatch(label) for label in labels):
        raise InvalidArgument(f"{where}: {host!r} is not a DNS name")
    return host
