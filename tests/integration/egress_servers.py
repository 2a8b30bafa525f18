"""Test servers for tests/integration/test_egress.py, standard library only.

``--ns``: run inside the network namespace the test made (198.51.100.1): HTTPS on 443, HTTP on
80 and 8088, a canary on 8081 (a port no rule grants), and a DNS server on 53/udp whose answers
are scripted per name (loopback, private, metadata, mixed, and a rebinding name that answers
198.51.100.1 first and 127.0.0.1 afterwards). ``--loopback PORT``: a canary on 127.0.0.1.
Every request, TLS failure and DNS query is appended as one JSON line to ``--log``; HTTP entries
carry the status line and body sent back (``sent``, base64) so tests can show what leaked.

Reflecting paths (any prefix, e.g. /v1/echo): ``echo`` the request headers as JSON;
``echo-gzip`` the same, gzip-compressed when Accept-Encoding asks for it; ``always-gzip``
compressed whatever was asked; ``reason`` answers ``401 Unauthorized <Authorization value>``;
``reflect/<form>`` returns the credential of the Authorization header in one encoding (FORMS).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gzip
import ipaddress
import json
import ssl
import struct
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, quote_plus

NS_ADDRESS = "198.51.100.1"
A, AAAA = 1, 28
DNS: dict[str, dict[int, list[str]]] = {
    "api.egress.test": {A: [NS_ADDRESS]},
    "keyed.egress.test": {A: [NS_ADDRESS]},
    "plain.egress.test": {A: [NS_ADDRESS]},
    "wrong.egress.test": {A: [NS_ADDRESS]},
    "svc.egress.test": {A: [NS_ADDRESS]},
    "x.svc.egress.test": {A: [NS_ADDRESS]},
    "loop.egress.test": {A: ["127.0.0.1"]},
    "private.egress.test": {A: ["10.0.0.1"]},
    "cgnat.egress.test": {A: ["100.64.0.1"]},
    "meta.egress.test": {A: ["169.254.169.254"]},
    "mcast.egress.test": {A: ["224.0.0.1"]},
    "zero.egress.test": {A: ["0.0.0.0"]},
    "mixed.egress.test": {A: [NS_ADDRESS, "127.0.0.1"]},
    "mapped.egress.test": {AAAA: ["::ffff:127.0.0.1"]},
    "meta6.egress.test": {AAAA: ["fd00:ec2::254"]},
}
REBIND = "rebind.egress.test"


def _password(credential: str) -> bytes:
    """Basic auth: the password inside base64("user:password")."""
    return base64.b64decode(credential).split(b":", 1)[1]


FORMS: dict[str, Callable[[str], bytes]] = {
    "json-slash": lambda c: json.dumps({"token": c}).replace("/", "\\/").encode(),
    "json-u": lambda c: "".join(ch if ch.isalnum() else f"\\u{ord(ch):04x}" for ch in c).encode(),
    "pct-upper": lambda c: quote(c, safe="").encode(),
    "pct-lower": lambda c: "".join(f"%{b:02x}" for b in c.encode()).encode(),
    "plus": lambda c: quote_plus(c).encode(),
    "b64": lambda c: base64.b64encode(c.encode()),
    "b64url-nopad": lambda c: base64.urlsafe_b64encode(c.encode()).rstrip(b"="),
    "b64-shift1": lambda c: base64.b64encode(b"<" + c.encode() + b">"),
    "b64-shift2": lambda c: base64.b64encode(b"<<" + c.encode()),
    "hex-upper": lambda c: c.encode().hex().upper().encode(),
    "password": _password,
    "password-b64url": lambda c: base64.urlsafe_b64encode(b"p=" + _password(c)).rstrip(b"="),
}


def reflect(path: str, headers: list[list[str]]) -> tuple[str, list[tuple[str, str]], bytes]:
    """The status line, extra headers and body for a reflecting path."""
    named = {k.lower(): v for k, v in headers}
    auth = named.get("authorization") or named.get("x-api-key", "")
    credential = auth.split(" ", 1)[-1]
    kind = path.split("?", 1)[0].split("/", 2)[-1]
    if kind == "reason":
        return f"401 Unauthorized {auth}", [], b"denied"
    if kind.startswith("reflect/"):
        return "200 OK", [], b"you sent: " + FORMS[kind.split("/", 1)[1]](credential)
    body = json.dumps(headers).encode()
    if kind == "always-gzip" or (
        kind == "echo-gzip" and "gzip" in named.get("accept-encoding", "")
    ):
        return "200 OK", [("Content-Encoding", "gzip")], gzip.compress(body)
    return "200 OK", [], body


class Log:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115

    def write(self, **entry: Any) -> None:
        self._file.write(json.dumps({"t": time.time(), **entry}) + "\n")


def http_handler(log: Log, listener: str) -> Any:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ssl.SSLError, ConnectionError) as exc:  # fmt: skip
            log.write(listener=listener, error=f"{type(exc).__name__}: {exc}")
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = [*lines[0].split(" "), "", ""][:3]
        headers = [line.split(":", 1) for line in lines[1:] if ":" in line]
        headers = [[k, v.strip()] for k, v in headers]
        length = int(next((v for k, v in headers if k.lower() == "content-length"), "0") or 0)
        body = await reader.readexactly(length) if length else b""
        sni = None
        ssl_object = writer.get_extra_info("ssl_object")
        if ssl_object is not None:
            sni = getattr(ssl_object, "server_hostname", None)
        log.write(listener=listener, method=method, path=path, headers=headers,
                  body=body.decode("latin-1"), sni=sni)  # fmt: skip
        status, extra, payload = "200 OK", "", f"hello from {listener} {path}".encode()
        if path == "/redirect":
            status, extra, payload = "302 Found", "Location: http://127.0.0.1:8088/stolen\r\n", b""
        elif path.split("/", 2)[-1].startswith(("echo", "always-gzip", "reason", "reflect/")):
            status, more, payload = reflect(path, headers)
            extra = "".join(f"{k}: {v}\r\n" for k, v in more)
        elif path.startswith("/v1/big/"):  # benchmarks: /v1/big/<bytes>
            payload = b"x" * min(int(path.rsplit("/", 1)[1]), 64 * 1024 * 1024)
        head = (
            f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(payload)}\r\n"
            f"{extra}Connection: close\r\n\r\n".encode()
        )
        log.write(listener=listener, sent_for=path, sent=base64.b64encode(head + payload).decode())
        writer.write(head + payload)
        await writer.drain()
        writer.close()

    return handle


class DnsServer(asyncio.DatagramProtocol):
    def __init__(self, log: Log) -> None:
        self._log = log
        self._rebind_queries = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport: asyncio.DatagramTransport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        qid, _flags, qd = struct.unpack("!HHH", data[:6])
        labels, pos = [], 12
        while data[pos]:
            labels.append(data[pos + 1 : pos + 1 + data[pos]].decode().lower())
            pos += 1 + data[pos]
        qtype, _qclass = struct.unpack("!HH", data[pos + 1 : pos + 5])
        question = data[12 : pos + 5]
        name = ".".join(labels)
        if name == REBIND:
            answers = {A: [NS_ADDRESS if self._rebind_queries == 0 else "127.0.0.1"]}
            if qtype == A:
                self._rebind_queries += 1
        else:
            answers = DNS.get(name)  # type: ignore[assignment]
        self._log.write(listener="dns", name=name, qtype=qtype)
        rcode = 3 if answers is None else 0
        records = b""
        found = (answers or {}).get(qtype, [])
        for value in found:
            rdata = ipaddress.ip_address(value).packed
            records += struct.pack("!HHHIH", 0xC00C, qtype, 1, 0, len(rdata)) + rdata
        header = struct.pack("!HHHHHH", qid, 0x8180 | rcode, qd, len(found), 0, 0)
        self._transport.sendto(header + question + records, addr)


async def serve_ns(log: Log, cert: str, key: str) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    def sni(_sock: Any, name: str | None, _context: Any) -> None:
        log.write(listener="sni", name=name)

    context.sni_callback = sni
    servers = [
        await asyncio.start_server(http_handler(log, "https"), NS_ADDRESS, 443, ssl=context),
        await asyncio.start_server(http_handler(log, "http"), NS_ADDRESS, 80),
        await asyncio.start_server(http_handler(log, "http-8088"), NS_ADDRESS, 8088),
        await asyncio.start_server(http_handler(log, "canary-8081"), NS_ADDRESS, 8081),
    ]
    loop = asyncio.get_running_loop()
    await loop.create_datagram_endpoint(lambda: DnsServer(log), local_addr=(NS_ADDRESS, 53))
    log.write(listener="ready")
    await asyncio.gather(*(s.serve_forever() for s in servers))


async def serve_loopback(log: Log, port: int) -> None:
    server = await asyncio.start_server(http_handler(log, "loopback-canary"), "127.0.0.1", port)
    log.write(listener="ready")
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--ns", action="store_true")
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--loopback", type=int)
    args = parser.parse_args()
    log = Log(args.log)
    if args.ns:
        asyncio.run(serve_ns(log, args.cert, args.key))
    else:
        asyncio.run(serve_loopback(log, args.loopback))


if __name__ == "__main__":
    main()
