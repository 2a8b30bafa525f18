"""Network attacks: every way out of an empty network namespace an agent might try.

Targets are only what the test names (``host_port`` on loopback, ``abstract``: a host abstract
socket name in hex) or documentation ranges no route reaches (RFC 5737, RFC 3849).
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct

from redteam_probe.probes.base import Attack, Opts, Refused

TIMEOUT = 3.0
V4_UNROUTABLE = "198.51.100.1"
V6_UNROUTABLE = "2001:db8::1"


def _connect(family: int, kind: int, address: tuple[object, ...], payload: bytes = b"") -> str:
    with socket.socket(family, kind) as sock:
        sock.settimeout(TIMEOUT)
        sock.connect(address)
        if payload:
            sock.send(payload)
        return f"connected to {address}"


def _port(opts: Opts) -> int:
    return int(opts.get("host_port", "9"))


def tcp_host_loopback(opts: Opts) -> str:
    return _connect(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", _port(opts)))


def udp_host_loopback(opts: Opts) -> str:
    # A UDP send "succeeds" into gVisor's own loopback; the host listener says what arrived.
    return _connect(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", _port(opts)), b"probe")


def tcp6_host_loopback(opts: Opts) -> str:
    return _connect(socket.AF_INET6, socket.SOCK_STREAM, ("::1", _port(opts)))


def tcp_v4_out(_opts: Opts) -> str:
    return _connect(socket.AF_INET, socket.SOCK_STREAM, (V4_UNROUTABLE, 443))


def udp_v4_out(_opts: Opts) -> str:
    return _connect(socket.AF_INET, socket.SOCK_DGRAM, (V4_UNROUTABLE, 53), b"probe")


def tcp_v6_out(_opts: Opts) -> str:
    return _connect(socket.AF_INET6, socket.SOCK_STREAM, (V6_UNROUTABLE, 443))


def udp_v6_out(_opts: Opts) -> str:
    return _connect(socket.AF_INET6, socket.SOCK_DGRAM, (V6_UNROUTABLE, 53), b"probe")


def icmp_ping(_opts: Opts) -> str:
    """An unprivileged ICMP echo (SOCK_DGRAM/IPPROTO_ICMP, "ping sockets")."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP) as sock:
        sock.settimeout(TIMEOUT)
        sock.sendto(struct.pack("!BBHHH", 8, 0, 0, 0, 1) + b"probe", (V4_UNROUTABLE, 0))
        return "echo request sent"


def raw_socket(_opts: Opts) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP):
        return "raw socket opened"


def raw6_socket(_opts: Opts) -> str:
    with socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6):
        return "raw IPv6 socket opened"


def packet_socket(_opts: Opts) -> str:
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003)):
        return "packet socket opened"


def _netlink(message_type: int, flags: int, body: bytes) -> int:
    """Send one rtnetlink request with an ACK asked for; the kernel's error code (0 = done)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.settimeout(TIMEOUT)
        sock.bind((0, 0))
        header = struct.pack("=LHHLL", 16 + len(body), message_type, flags | 0x1 | 0x4, 1, 0)
        sock.send(header + body)
        reply = sock.recv(65536)
    length, kind = struct.unpack("=LH", reply[:6])
    if kind != 2:  # NLMSG_ERROR
        raise Refused(f"unexpected netlink reply type {kind} ({length} bytes)")
    return int(struct.unpack("=i", reply[16:20])[0])


def _ack(code: int, what: str) -> str:
    if code != 0:
        raise OSError(-code, f"{what}: {os.strerror(-code)}")
    return f"{what}: kernel acknowledged"


def netlink_route_add(_opts: Opts) -> str:
    """RTM_NEWROUTE: a default route out of ``lo`` (ifindex 1)."""
    rtmsg = struct.pack("=BBBBBBBBI", socket.AF_INET, 0, 0, 0, 254, 3, 0, 1, 0)
    oif = struct.pack("=HHI", 8, 4, 1)  # RTA_OIF = 1
    gateway = struct.pack("=HH", 8, 5) + socket.inet_aton(V4_UNROUTABLE)  # RTA_GATEWAY
    return _ack(_netlink(24, 0x400 | 0x200, rtmsg + oif + gateway), "add default route")


def netlink_addr_add(_opts: Opts) -> str:
    """RTM_NEWADDR: give ``lo`` an address on a documentation range."""
    ifaddr = struct.pack("=BBBBI", socket.AF_INET, 24, 0, 0, 1)
    local = struct.pack("=HH", 8, 2) + socket.inet_aton("198.51.100.7")  # IFA_LOCAL
    return _ack(_netlink(20, 0x400 | 0x200, ifaddr + local), "add address")


def netlink_link_add(_opts: Opts) -> str:
    """RTM_NEWLINK of kind dummy: a new interface."""
    ifinfo = struct.pack("=BBHiII", socket.AF_UNSPEC, 0, 0, 0, 0, 0)
    name = struct.pack("=HH", 4 + 8, 3) + b"evil0\0\0\0"  # IFLA_IFNAME
    kind = struct.pack("=HH", 4 + 8, 1) + b"dummy\0\0\0"  # IFLA_INFO_KIND
    linkinfo = struct.pack("=HH", 4 + len(kind), 18) + kind  # IFLA_LINKINFO
    return _ack(_netlink(16, 0x400 | 0x200, ifinfo + name + linkinfo), "add link")


def interfaces(_opts: Opts) -> str:
    """Anything but loopback in the interface list is a way out."""
    names = [name for _index, name in socket.if_nameindex()]
    if names == ["lo"]:
        raise Refused("only lo")
    return f"interfaces: {names}"


def tun_create(_opts: Opts) -> str:
    """TUNSETIFF on /dev/net/tun (gVisor's own): a new interface needs CAP_NET_ADMIN."""
    with open("/dev/net/tun", "r+b", buffering=0) as tun:
        request = struct.pack("16sH", b"evil%d", 0x0001 | 0x1000)  # IFF_TUN | IFF_NO_PI
        fcntl.ioctl(tun, 0x400454CA, request + b"\0" * 22)  # TUNSETIFF
    return "created a tun interface"


def dns(_opts: Opts) -> str:
    infos = socket.getaddrinfo("example.com", 443, proto=socket.IPPROTO_TCP)
    return f"resolved: {sorted({i[4][0] for i in infos})}"


def abstract_unix(opts: Opts) -> str:
    """A host abstract Unix socket (named by the test, in hex): abstract names belong to a
    network namespace, so the host's are another world."""
    name = bytes.fromhex(opts.get("abstract", "00"))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT)
        sock.connect(name)
        return f"connected to abstract {name!r}"


ATTACKS: dict[str, Attack] = {
    "net.tcp.host-loopback": tcp_host_loopback,
    "net.udp.host-loopback": udp_host_loopback,
    "net.tcp6.host-loopback": tcp6_host_loopback,
    "net.tcp.v4-out": tcp_v4_out,
    "net.udp.v4-out": udp_v4_out,
    "net.tcp.v6-out": tcp_v6_out,
    "net.udp.v6-out": udp_v6_out,
    "net.icmp.echo-out": icmp_ping,
    "net.raw.ipv4": raw_socket,
    "net.raw.ipv6": raw6_socket,
    "net.packet.socket": packet_socket,
    "net.netlink.route-add": netlink_route_add,
    "net.netlink.addr-add": netlink_addr_add,
    "net.netlink.link-add": netlink_link_add,
    "net.interfaces.beyond-lo": interfaces,
    "net.tun.create": tun_create,
    "net.dns.resolve": dns,
    "net.unix.host-abstract": abstract_unix,
}
