"""Attacks on the session's own sockets: fuzzed gRPC/HTTP/2 on model, egress and gateway,
garbage on the control socket, and the approval gateway used against itself. Each fuzz ends
with a well-formed call: the attack "worked" if the socket no longer answers it."""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import time

import grpc

from redteam_probe.probes.base import Attack, Opts, Refused

SOCKETS = "/run/ironclaw"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
GATEWAY = "/ironclaw.gateway.v1.GatewayService"
# A method on each socket that answers without side effects, for the after-fuzz check.
PROBE_CALL = {
    "model.sock": ("/ironclaw.model.v1.ModelService/GetProfile", b""),
    "gateway.sock": (f"{GATEWAY}/GetChange", b"\x0a\x07nothing"),
    "egress.sock": ("/ironclaw.egress.v1.EgressService/Fetch", b""),
}
ANSWERED = {"OK", "NOT_FOUND", "INVALID_ARGUMENT", "PERMISSION_DENIED", "FAILED_PRECONDITION",
            "UNIMPLEMENTED", "RESOURCE_EXHAUSTED"}  # fmt: skip


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        struct.pack("!I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack("!I", stream)
        + payload
    )


def _literal(name: bytes, value: bytes) -> bytes:
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def _headers(path: str) -> bytes:
    block = b"\x83\x86" + b"\x04" + bytes([len(path)]) + path.encode()
    block += b"\x01\x09localhost" + _literal(b"content-type", b"application/grpc")
    block += _literal(b"te", b"trailers")
    return _frame(1, 0x4, 1, block)


def _blast(path: str, payloads: list[bytes]) -> int:
    """Send each payload on a fresh connection, reading whatever comes back briefly."""
    sent = 0
    for payload in payloads:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2.0)
            try:
                sock.connect(path)
                sock.sendall(payload)
                sent += len(payload)
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(65536):
                    pass
            except OSError:
                pass
    return sent


def _payloads(method: str, seed: int) -> list[bytes]:
    rng = random.Random(seed)  # noqa: S311 - reproducible fuzz, not secrets
    garbage = [rng.randbytes(rng.randrange(1, 4096)) for _ in range(24)]
    grpc_len = struct.pack("!BI", 0, 0xFFFFFFFF)
    return [
        *garbage,
        PREFACE,  # then nothing: a half-open HTTP/2 connection
        PREFACE + SETTINGS + _frame(0x7, 0, 0, b"\xff" * 3),  # truncated GOAWAY
        PREFACE + SETTINGS + _headers(method) + _frame(0, 0x1, 1, grpc_len + b"x" * 64),
        PREFACE + SETTINGS + _headers(method) + _frame(0, 0x1, 1, b"\x00\x00"),  # cut prefix
        PREFACE + SETTINGS + _headers("/no.Such/Method") + _frame(0, 0x1, 1, b"\x00" * 5),
        PREFACE + SETTINGS + _frame(1, 0x4, 1, rng.randbytes(512)),  # HPACK garbage
        PREFACE + SETTINGS + _frame(0, 0, 1, rng.randbytes(16384)),  # DATA on an idle stream
        PREFACE + SETTINGS + b"".join(_headers(method) for _ in range(1)) + rng.randbytes(1 << 20),
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x02\x00" + rng.randbytes(512),  # a TLS ClientHello's start
    ]


def _call(path: str, method: str, body: bytes) -> str:
    with grpc.insecure_channel(f"unix:{path}") as channel:
        call = channel.unary_stream(method, request_serializer=None, response_deserializer=None)
        try:
            for _ in call(body, timeout=10):
                break
        except grpc.RpcError as err:
            return str(err.code().name)
    return "OK"


def _fuzz(name: str) -> object:
    path = f"{SOCKETS}/{name}"
    if not os.path.exists(path):
        raise Refused(f"{path} does not exist in this session")
    method, body = PROBE_CALL[name]
    before = _call(path, method, body)
    sent = _blast(path, _payloads(method, hash(name) & 0xFFFF))
    after = _call(path, method, body)
    detail = {"before": before, "after": after, "bytes_sent": sent}
    if after in ANSWERED:
        raise Refused(json.dumps(detail))
    return detail


def fuzz_model(_opts: Opts) -> object:
    return _fuzz("model.sock")


def fuzz_egress(_opts: Opts) -> object:
    return _fuzz("egress.sock")


def fuzz_gateway(_opts: Opts) -> object:
    return _fuzz("gateway.sock")


def _control_lines(lines: list[bytes], hello: bool = True) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5.0)
        sock.connect(f"{SOCKETS}/control.sock")
        if hello:
            sock.sendall(f"hello {os.getpid()} {os.getuid()}\n".encode())
        for line in lines:
            sock.sendall(line)
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if not sock.recv(65536):
                    break
            except TimeoutError:
                break
    return f"sent {sum(map(len, lines))} bytes in {len(lines)} writes"


def fuzz_control(opts: Opts) -> str:
    rng = random.Random(7)  # noqa: S311 - reproducible fuzz, not secrets
    lines = [rng.randbytes(rng.randrange(1, 200)).replace(b"\n", b"") + b"\n" for _ in range(200)]
    lines += [b"outbound -1\n", b"outbound 99999999999999999999999\n", b"inbound 5\n",
              b"\xff\xfe\n", b"x" * 70000 + b"\n"]  # fmt: skip
    return _control_lines(lines)


def control_no_hello(_opts: Opts) -> str:
    return _control_lines([b"x" * 300 + b"\n"], hello=False)


def gateway_approve_own(_opts: Opts) -> str:
    """Submit a change, then call every approving method anyone ever named on gateway.sock."""
    path = f"{SOCKETS}/gateway.sock"
    codes = {}
    for method in (f"{GATEWAY}/ApproveChange", f"{GATEWAY}/Approve", f"{GATEWAY}/DecideChange",
                   "/ironclaw.admin.v1.AdminService/ApproveChange",
                   "/ironclaw.admin.v1.AdminService/DecideChange"):  # fmt: skip
        with grpc.insecure_channel(f"unix:{path}") as channel:
            call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            try:
                call(b"\x0a\x01x", timeout=10)
                codes[method] = "OK"
            except grpc.RpcError as err:
                codes[method] = err.code().name
    if all(code == "UNIMPLEMENTED" for code in codes.values()):
        raise Refused(json.dumps(codes))
    return json.dumps(codes)


def _submit(agent: str, reason: str) -> tuple[str, str, str]:
    payload = json.dumps({"persona": f"red team {reason} {os.getpid()}"})
    body = b"\x0a" + bytes([len("persona")]) + b"persona"
    body += b"\x12" + bytes([len(payload)]) + payload.encode()
    body += b"\x1a" + bytes([len(reason)]) + reason.encode()
    if agent:
        body += b"\x22" + bytes([len(agent)]) + agent.encode()
    with grpc.insecure_channel(f"unix:{SOCKETS}/gateway.sock") as channel:
        call = channel.unary_unary(f"{GATEWAY}/SubmitChange", request_serializer=None,
                                   response_deserializer=None)  # fmt: skip
        try:
            raw = bytes(call(body, timeout=10))
        except grpc.RpcError as err:
            return err.code().name, str(err.details()), ""
    return "OK", raw.hex(), raw[4 : 4 + raw[3]].decode(errors="replace") if len(raw) > 4 else ""


def gateway_forged_agent(opts: Opts) -> str:
    """A change for another agent (the test names one), submitted from this session's socket."""
    code, detail, _ = _submit(opts.get("other_agent", "demo"), "forged")
    if code != "OK":
        raise Refused(f"{code}: {detail}")
    return f"accepted: {detail}"


def gateway_peek_other(opts: Opts) -> str:
    """GetChange of a change another session submitted (its id named by the test)."""
    code = _call(f"{SOCKETS}/gateway.sock", f"{GATEWAY}/GetChange",
                 b"\x0a" + bytes([len(opts.get("other_change", "x"))])
                 + opts.get("other_change", "x").encode())  # fmt: skip
    if code != "OK":
        raise Refused(code)
    return "read another session's change"


def gateway_replay(_opts: Opts) -> str:
    """The same submission twice: each is a new pending change, never an approved one."""
    first = _submit("", "replay")
    second = _submit("", "replay")
    if first[0] != "OK" or second[0] != "OK":
        raise Refused(f"{first[0]}/{second[0]}")
    return json.dumps({"first": first[2], "second": second[2], "raw": second[1]})


ATTACKS: dict[str, Attack] = {
    "sockets.fuzz.model": fuzz_model,
    "sockets.fuzz.egress": fuzz_egress,
    "sockets.fuzz.gateway": fuzz_gateway,
    "sockets.fuzz.control": fuzz_control,
    "sockets.control.no-hello": control_no_hello,
    "gateway.approve-own-change": gateway_approve_own,
    "gateway.forged-agent": gateway_forged_agent,
    "gateway.peek-other-session": gateway_peek_other,
    "gateway.replay": gateway_replay,
}
