"""Which addresses the egress broker may reach (ironclawd/domain/addresses.py): pure."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ironclawd.domain.addresses import parse_internal_cidr, refusal_reason

DOCS = ipaddress.ip_network("198.51.100.0/24")


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"), ("127.255.255.254", "loopback"), ("::1", "loopback"),
        ("0.0.0.0", "unspecified"), ("::", "unspecified"),
        ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"),
        ("fc00::1", "private"), ("fd12:3456::1", "private"),
        ("169.254.1.1", "link-local"), ("fe80::1", "link-local"),
        ("169.254.169.254", "metadata"), ("fd00:ec2::254", "metadata"),
        ("100.100.100.200", "metadata"), ("fd20:ce::254", "metadata"),
        ("fd00:c1::a9fe:a9fe", "metadata"), ("fec0::1", "site-local"),
        ("100.64.0.1", "CGNAT"), ("100.127.255.254", "CGNAT"),
        ("224.0.0.1", "multicast"), ("239.1.1.1", "multicast"), ("ff02::1", "multicast"),
        ("255.255.255.255", "broadcast"),
        ("::ffff:127.0.0.1", "IPv4-mapped"), ("::ffff:8.8.8.8", "IPv4-mapped"),
        ("::127.0.0.1", "IPv4-compatible"), ("64:ff9b::7f00:1", "NAT64"),
        ("::ffff:0:7f00:1", "IPv4-translated"), ("::ffff:0:808:808", "IPv4-translated"),
        ("2002:7f00:1::1", "6to4"), ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
        ("198.51.100.7", "private"), ("240.0.0.1", "private"),
        ("0.1.2.3", "this network"),
    ],
)  # fmt: skip
def test_refused_addresses_name_their_class(address: str, reason: str) -> None:
    found = refusal_reason(ipaddress.ip_address(address))
    assert found is not None
    assert reason in found


@pytest.mark.parametrize("address", ["93.184.215.14", "1.1.1.1", "2606:4700::1111"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert refusal_reason(ipaddress.ip_address(address)) is None


def test_internal_cidrs_open_only_what_they_name() -> None:
    assert refusal_reason(ipaddress.ip_address("198.51.100.1"), [DOCS]) is None
    assert refusal_reason(ipaddress.ip_address("192.0.2.1"), [DOCS]) is not None
    ten = ipaddress.ip_network("10.0.0.0/8")
    assert refusal_reason(ipaddress.ip_address("10.9.9.9"), [ten]) is None


@pytest.mark.parametrize(
    "cidr", ["127.0.0.0/8", "0.0.0.0/0", "169.254.169.0/24", "::/0", "fe80::/64", "10.0.0.1/8",
             "224.0.0.0/24", "::ffff:0:0/96", "100.100.100.200/32", "fd00:ec2::254/128"],
)  # fmt: skip
def test_internal_cidrs_cannot_open_the_never_ranges(cidr: str) -> None:
    with pytest.raises(ValueError, match=r"which may never be reached|has host bits set"):
        parse_internal_cidr(cidr)


@pytest.mark.parametrize(
    ("cidr", "metadata"),
    [("100.64.0.0/10", "100.100.100.200"), ("fd00::/8", "fd00:ec2::254"),
     ("fd20::/16", "fd20:ce::254"), ("fd00:c1::/32", "fd00:c1::a9fe:a9fe")],
)  # fmt: skip
def test_a_range_holding_a_metadata_address_opens_all_of_it_but_that(
    cidr: str, metadata: str
) -> None:
    """An operator's Tailscale range (100.64.0.0/10) or ULA prefix is accepted: refusing it
    would fail a configuration that started before at the next start. The metadata address in it
    stays closed."""
    opened = [parse_internal_cidr(cidr)]
    assert refusal_reason(ipaddress.ip_address(metadata), opened) == "cloud metadata address"
    neighbour = ipaddress.ip_address(metadata) + 1
    assert refusal_reason(neighbour, opened) is None


@given(
    st.ip_addresses(v=4, network="127.0.0.0/8")
    | st.ip_addresses(v=4, network="169.254.0.0/16")
    | st.ip_addresses(v=6, network="::ffff:0:0/96")
    | st.ip_addresses(v=4, network="0.0.0.0/8")
)
def test_never_ranges_stay_closed_whatever_internal_cidrs_say(addr: ipaddress._BaseAddress) -> None:
    everything = [ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")]
    assert refusal_reason(addr, everything) is not None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "address", ["169.254.169.254", "fd00:ec2::254", "100.100.100.200", "fd20:ce::254",
                "fd00:c1::a9fe:a9fe"],
)  # fmt: skip
def test_every_clouds_metadata_address_stays_closed_whatever_internal_cidrs_say(
    address: str,
) -> None:
    """Only AWS's were in the never tier, and Alibaba's (in CGNAT), GCP's and Oracle's IPv6
    ones (in unique-local) sit in ranges an operator may open: opening 100.64.0.0/10 opened
    the instance's credentials (found by a review)."""
    everything = [ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")]
    found = refusal_reason(ipaddress.ip_address(address), everything)
    assert found is not None
    assert "metadata" in found


def test_deprecated_site_local_is_not_taken_for_global_but_can_be_opened() -> None:
    # Python 3.11.2's is_global is True for fec0::/10.
    assert refusal_reason(ipaddress.ip_address("fec0::1")) is not None
    opened = [ipaddress.ip_network("fec0::/10")]
    assert refusal_reason(ipaddress.ip_address("fec0::1"), opened) is None


@given(st.ip_addresses(v=6))
def test_v6_forms_embedding_a_refused_v4_are_refused(addr: ipaddress.IPv6Address) -> None:
    if addr.ipv4_mapped is not None and refusal_reason(addr.ipv4_mapped) is not None:
        assert refusal_reason(addr) is not None
