"""Which network addresses the egress broker may connect to (docs/architecture.md §6). Pure.

Two tiers of refusal:
- **never**: unspecified, loopback, link-local (which holds the cloud metadata service),
  multicast, the metadata addresses themselves (AWS's, and those other clouds keep outside
  link-local: Alibaba's in CGNAT, GCP's and Oracle's IPv6 ones in unique-local), and IPv6
  forms that embed an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-translated
  ``::ffff:0:a.b.c.d`` (SIIT), IPv4-compatible ``::a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4
  ``2002::/16``, Teredo ``2001::/32``) — a v4 wall is not to be walked around in v6 clothing.
  No configuration opens these.
- **not public**: everything else that is not globally routable (RFC 1918, unique-local
  ``fc00::/7``, deprecated site-local ``fec0::/10``, CGNAT ``100.64.0.0/10``, documentation,
  benchmarking, reserved, broadcast...).
  The operator may open chosen ranges of these with ``[egress] internal_cidrs``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from ironclawd import lazy_re

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Cloud metadata services (instance credentials): AWS (v4, v6), Alibaba ECS, GCP over IPv6,
# Oracle over IPv6. The non-link-local ones sit in ranges an operator may open (CGNAT, ULA).
METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "fd20:ce::254",
              "fd00:c1::a9fe:a9fe")
)  # fmt: skip
CGNAT = ipaddress.ip_network("100.64.0.0/10")
THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")  # RFC 1122 "this network"
NAT64 = ipaddress.ip_network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # RFC 2765 (SIIT)
# Ranges that internal_cidrs may never overlap (config validation uses this). The metadata
# addresses outside them are not here: a range holding one (an operator's 100.64.0.0/10 or
# fd00::/8) is accepted and the address alone stays closed (never_reason checks METADATA first);
# refusing the range made a configuration that had started fine fail at the next start.
NEVER_NETWORKS: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "255.255.255.255/32",
        "::/96", "::ffff:0:0/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48",
        "2002::/16", "2001::/32", "fe80::/10", "ff00::/8",
    )
)  # fmt: skip


def never_reason(addr: IPAddress) -> str | None:  # noqa: PLR0911, PLR0912
    """Why ``addr`` may never be reached, whatever the configuration; None if it may be."""
    if addr in METADATA:
        return "cloud metadata address"
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return "IPv4-mapped IPv6 address"
        if addr in IPV4_COMPATIBLE and not addr.is_unspecified and not addr.is_loopback:
            return "IPv4-compatible IPv6 address"
        if addr in IPV4_TRANSLATED:
            return "IPv4-translated IPv6 address (SIIT, embeds IPv4)"
        if addr in NAT64 or addr in NAT64_LOCAL:
            return "NAT64 address (embeds IPv4)"
        if addr.sixtofour is not None:
            return "6to4 address (embeds IPv4)"
        if addr.teredo is not None:
            return "Teredo address (embeds IPv4)"
    if addr.is_unspecified:
        return "unspecified address"
    if addr in THIS_NETWORK:
        return "'this network' address (0.0.0.0/8)"
    if addr.is_loopback:
        return "loopback address"
    if addr.is_link_local:
        return "link-local address"
    if addr.is_multicast:
        return "multicast address"
    if isinstance(addr, ipaddress.IPv4Address) and addr == ipaddress.IPv4Address("255.255.255.255"):
        return "broadcast address"
    return None


def refusal_reason(addr: IPAddress, internal: Iterable[IPNetwork] = ()) -> str | None:  # noqa: PLR0911
    """Why the broker must not connect to ``addr``; None if it may."""
    reason = never_reason(addr)
    if reason is not None:
        return reason
    if any(addr in net for net in internal if net.version == addr.version):
        return None
    if addr.version == 4 and addr in CGNAT:
        return "shared address space (CGNAT, RFC 6598)"
    if addr.is_private:
        return "private address"
    if isinstance(addr, ipaddress.IPv6Address) and addr.is_site_local:
        # fec0::/10 was deprecated (RFC 3879) but is still routed inside some sites, and
        # Python 3.11.2's is_global takes it for a global address.
        return "site-local address (fec0::/10, deprecated by RFC 3879)"
    if not addr.is_global:
        return "not a globally routable address"
    return None


def parse_internal_cidr(text: str) -> IPNetwork:
    """One ``internal_cidrs`` entry; refuses host bits, and anything that overlaps a range that
    may never be reached (ValueError naming it)."""
    net = ipaddress.ip_network(text, strict=True)
    if net.num_addresses == 1 and net.network_address in METADATA:
        raise ValueError(f"{text} is a cloud metadata address, which may never be reached")
    for never in NEVER_NETWORKS:
        if net.version == never.version and net.overlaps(never):
            raise ValueError(f"{text} overlaps {never}, which may never be reached")
    return net


# A host is "numeric" if its last label is a number in any base inet_aton(3) accepts (decimal,
# 0x hex, 0 octal): WHATWG's "ends in a number" rule. Such hosts are accepted only as canonical
# dotted-quad IPv4, so 2130706433, 0x7f.1, 0177.0.0.1 and 127.1 cannot name loopback.
_NUMERIC_LABEL = lazy_re.compile(r"(0x[0-9a-f]*|[0-9]+)", re.IGNORECASE)


def is_numeric_host(host: str) -> bool:
    last = host.rstrip(".").rsplit(".", 1)[-1]
    return bool(_NUMERIC_LABEL.fullmatch(last))


def canonical_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The address if ``host`` is canonical dotted-quad decimal (no leading zeros), else None."""
    parts = host.split(".")
    if len(parts) != 4 or not all(
        p.isdigit() and p.isascii() and (p == "0" or not p.startswith("0")) and int(p) <= 255
        for p in parts
    ):
        return None
    return ipaddress.IPv4Address(host)
