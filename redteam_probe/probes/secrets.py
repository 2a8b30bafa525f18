"""Canary secrets, looked for in every form they could take inside the box: every readable file
(/proc included: each process's environ and cmdline), and whatever the host's services hand the
box when the model provider or an egress upstream echoes the secret back.

The test passes each canary masked (``needles``: ``label:PAD:MASKED``, hex, MASKED = canary XOR
PAD), so no argv the box can read holds any encoding of it; results name encodings, never values.
"""

from __future__ import annotations

import base64
import gzip
import json
import urllib.parse
import zlib

import grpc

from ironclaw.egress.v1 import egress_pb2, egress_pb2_grpc
from ironclaw.model.v1 import model_pb2, model_pb2_grpc
from redteam_probe.probes.base import Attack, Opts, Refused
from redteam_probe.probes.grep import grep_tree

SOCKETS = "/run/ironclaw"
# What the fake provider echoes (tests/harness/fake_providers.py).
MODEL_ECHOES = ("/echo-key-text", "/echo-key-tool", "/echo-key-escaped", "/echo-key-401")


def canaries(opts: Opts) -> dict[str, bytes]:
    found = {}
    for item in filter(None, opts.get("needles", "").split(",")):
        label, pad, masked = item.split(":")
        found[label] = bytes(a ^ b for a, b in zip(bytes.fromhex(pad), bytes.fromhex(masked),
                                                    strict=True))  # fmt: skip
    if not found:
        raise Refused("no canaries given")
    return found


def _b64_cores(secret: bytes, encode: object) -> dict[str, bytes]:
    """Base64 of the secret at each of the three alignments it can have inside a longer string
    (``user:secret`` in a Basic header, say): the part of the encoding that is the secret's
    alone, without the first and last groups, which depend on the neighbours."""
    cores = {}
    for shift in range(3):
        text = encode(b"\0" * shift + secret)  # type: ignore[operator]
        cores[f"{shift}"] = text.rstrip(b"=")[4:-4]
    return cores


def encodings(secret: bytes) -> dict[str, bytes]:
    text = secret.decode("utf-8", "replace")
    forms = {
        "raw": secret,
        "hex": secret.hex().encode(),
        "HEX": secret.hex().upper().encode(),
        "base64": base64.b64encode(secret),
        "base64url": base64.urlsafe_b64encode(secret).rstrip(b"="),
        "percent": urllib.parse.quote(secret, safe="").encode(),
        "percent-all": "".join(f"%{b:02X}" for b in secret).encode(),
        "percent-lower": "".join(f"%{b:02x}" for b in secret).encode(),
        "plus": urllib.parse.quote_plus(secret).encode(),
        "json": json.dumps(text)[1:-1].encode(),
        "json-slash": json.dumps(text)[1:-1].replace("/", "\\/").encode(),
        "json-unicode": "".join(f"\\u{ord(c):04x}" for c in text).encode(),
        "json-unicode-punct": "".join(
            c if c.isalnum() else f"\\u{ord(c):04x}" for c in text
        ).encode(),
        "reversed": secret[::-1],
    }
    for shift, core in _b64_cores(secret, base64.b64encode).items():
        forms[f"base64-in-{shift}"] = core
    for shift, core in _b64_cores(secret, base64.urlsafe_b64encode).items():
        forms[f"base64url-in-{shift}"] = core
    return forms


def _search(blobs: dict[str, bytes], secrets_: dict[str, bytes]) -> dict[str, list[str]]:
    """label -> ["where:encoding", ...] for every encoding of every canary found in a blob."""
    hits: dict[str, list[str]] = {label: [] for label in secrets_}
    for label, secret in secrets_.items():
        for form, needle in encodings(secret).items():
            hits[label] += [f"{where}:{form}" for where, blob in blobs.items() if needle in blob]
    return hits


def _result(hits: dict[str, list[str]], searched: str) -> object:
    if any(hits.values()):
        return {"hits": hits, "searched": searched}
    raise Refused(f"no canary in any encoding; searched {searched}")


def files(opts: Opts) -> object:
    """Every readable file of the box, /proc/*/environ, cmdline, maps and status included."""
    secrets_ = canaries(opts)
    labels, needles = [], []
    for label, secret in secrets_.items():
        for form, needle in encodings(secret).items():
            labels.append(f"{label}:{form}")
            needles.append(needle)
    report = grep_tree(needles)
    hits: dict[str, list[str]] = {label: [] for label in secrets_}
    for label, needle in zip(labels, needles, strict=True):
        for path in report["hits"][needle.hex()]:  # type: ignore[index]
            hits[label.split(":")[0]].append(f"{path}:{label.split(':')[1]}")
    return _result(hits, f"{report['files']} files, {report['bytes']} bytes")


def _unzip(body: bytes, encoding: str) -> bytes:
    try:
        if encoding == "gzip":
            return gzip.decompress(body)
        if encoding == "deflate":
            return zlib.decompress(body)
    except (OSError, zlib.error, EOFError):
        return b""
    return b""


def model_echoes(opts: Opts) -> object:
    """Ask the model to echo the key it was sent, every way the fake provider can, both as a
    stream (Complete) and whole (Answer)."""
    secrets_ = canaries(opts)
    blobs: dict[str, bytes] = {}
    with grpc.insecure_channel(f"unix:{SOCKETS}/model.sock") as channel:
        stub = model_pb2_grpc.ModelServiceStub(channel)
        for prompt in MODEL_ECHOES:
            request = model_pb2.CompleteRequest(messages=[model_pb2.Message(
                role=model_pb2.ROLE_USER, text=prompt)])  # fmt: skip
            for way in ("stream", "whole"):
                got = b""
                try:
                    if way == "stream":
                        for event in stub.Complete(request, timeout=60):
                            got += event.SerializeToString()
                    else:
                        got += stub.Answer(request, timeout=60).SerializeToString()
                except grpc.RpcError as err:
                    got += f"{err.code().name} {err.details()}".encode()
                    got += repr(err.trailing_metadata()).encode()
                blobs[f"model{prompt}" if way == "stream" else f"model-whole{prompt}"] = got
    return _result(_search(blobs, secrets_), f"{len(blobs)} model answers")


# Paths of the test's reflecting upstream (tests/integration/egress_servers.py), each asked for
# with every encoding; an upstream without them answers something harmless.
REFLECT_FORMS = (
    "json-slash",
    "json-u",
    "pct-upper",
    "pct-lower",
    "plus",
    "b64",
    "b64url-nopad",
    "b64-shift1",
    "b64-shift2",
    "hex-upper",
    "password",
    "password-b64url",
)
EGRESS_TRIES: tuple[tuple[str, list[tuple[str, str]]], ...] = (
    ("echo", [("Accept-Encoding", "gzip")]),
    ("echo", [("Accept-Encoding", "deflate")]),
    ("echo", [("Accept-Encoding", "br, gzip;q=0.5")]),
    ("echo", [("Accept-Encoding", "identity")]),
    ("echo?access_token=probe", [("X-Api-Key", "probe")]),
    ("echo", [("Authorization", "Bearer agent-made"), ("authorization", "x")]),
    ("echo-gzip", [("Accept-Encoding", "gzip")]),
    ("always-gzip", [("Accept-Encoding", "identity")]),
    ("reason", []),
    *((f"reflect/{form}", [("Accept-Encoding", "gzip")]) for form in REFLECT_FORMS),
)


def egress_echoes(opts: Opts) -> object:
    """Fetch an upstream that echoes request headers (named by the test) through the broker,
    asking for every encoding; decompress what comes back and look for the injected secret in
    the reason phrase, the headers and the body."""
    secrets_ = canaries(opts)
    bases = [b for b in opts.get("egress_base", "").split(",") if b]
    if not bases:
        raise Refused("no egress_base given")
    blobs: dict[str, bytes] = {}
    with grpc.insecure_channel(f"unix:{SOCKETS}/egress.sock") as channel:
        stub = egress_pb2_grpc.EgressServiceStub(channel)
        tries = [(base + path, headers) for base in bases for path, headers in EGRESS_TRIES]
        for index, (url, headers) in enumerate(tries):
            request = egress_pb2.FetchRequest(method="GET", url=url, headers=[
                egress_pb2.Header(name=k, value=v) for k, v in headers])  # fmt: skip
            head, body = b"", b""
            encoding = ""
            try:
                for event in stub.Fetch(request, timeout=60):
                    if event.HasField("head"):
                        head = event.head.SerializeToString()
                        encoding = next((h.value.lower() for h in event.head.headers
                                         if h.name.lower() == "content-encoding"), "")  # fmt: skip
                    elif event.HasField("body_chunk"):
                        body += event.body_chunk
            except grpc.RpcError as err:
                head += f"{err.code().name} {err.details()}".encode()
            blobs[f"egress{index}"] = head + body + _unzip(body, encoding)
    return _result(_search(blobs, secrets_), f"{len(blobs)} egress answers")


ATTACKS: dict[str, Attack] = {
    "secrets.files": files,
    "secrets.model-echo": model_echoes,
    "secrets.egress-echo": egress_echoes,
}
