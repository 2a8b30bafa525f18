"""The ``http_fetch`` tool's client: one request through the host's egress broker.

The broker decides everything (rules, addresses, credentials, caps); this side only builds the
request and turns the streamed answer into text for the model. Redirects come back as they are:
fetching a Location is the model's next request, checked by the broker from scratch.
"""

from __future__ import annotations

import grpc

from agent.metered import call_metered
from ironclaw.egress.v1 import egress_pb2, egress_pb2_grpc

CALL_TIMEOUT = 120.0
MAX_RESULT_CHARS = 64 * 1024  # what the model gets back; the broker caps the body itself

_channels: dict[str, grpc.Channel] = {}


def close_channels() -> None:
    """Close the kept channels (the agent is idle: gRPC's threads end with the last channel);
    the next call opens one again."""
    while _channels:
        _channels.popitem()[1].close()


class FetchError(Exception):
    pass


def _headers(raw: object) -> list[egress_pb2.Header]:
    """Headers as {"name": "value"} or [["name", "value"], ...] (repeats need the list form)."""
    if raw is None:
        return []
    pairs: list[tuple[object, object]]
    if isinstance(raw, dict):
        pairs = list(raw.items())
    elif isinstance(raw, list) and all(isinstance(p, list) and len(p) == 2 for p in raw):
        pairs = [(p[0], p[1]) for p in raw]
    else:
        raise FetchError('headers: expected {"name": "value"} or [["name", "value"], ...]')
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs):
        raise FetchError("headers: names and values must be strings")
    return [egress_pb2.Header(name=str(k), value=str(v)) for k, v in pairs]


def _stub(socket_path: str) -> egress_pb2_grpc.EgressServiceStub:
    # One channel kept while the agent is busy (set-up costs ~20 ms across gVisor); closed when
    # it goes idle (close_channels).
    channel = _channels.get(socket_path)
    if channel is None:
        channel = _channels[socket_path] = grpc.insecure_channel(f"unix:{socket_path}")
    return egress_pb2_grpc.EgressServiceStub(channel)


def fetch(args: dict[str, object], socket_path: str) -> str:
    """Run one fetch; the answer (or the broker's refusal) as text for the model."""
    url = args.get("url")
    if not isinstance(url, str) or not url:
        raise FetchError("url: expected a string")
    body = args.get("body", "")
    if not isinstance(body, str):
        raise FetchError("body: expected a string")
    request = egress_pb2.FetchRequest(
        method=str(args.get("method") or "GET"),
        url=url,
        headers=_headers(args.get("headers")),
        body=body.encode("utf-8"),
    )
    try:
        head, chunks, end = call_metered(lambda: _exchange(request, socket_path))
    except grpc.RpcError as err:
        return f"error: egress {err.code().name}: {err.details()}"
    if head is None:
        return "error: egress: the broker sent no response head"
    return render(head, b"".join(chunks), end)


def _exchange(
    request: egress_pb2.FetchRequest, socket_path: str
) -> tuple[egress_pb2.ResponseHead | None, list[bytes], egress_pb2.ResponseEnd | None]:
    head: egress_pb2.ResponseHead | None = None
    chunks: list[bytes] = []
    end: egress_pb2.ResponseEnd | None = None
    for event in _stub(socket_path).Fetch(request, timeout=CALL_TIMEOUT):
        kind = event.WhichOneof("event")
        if kind == "head":
            head = event.head
        elif kind == "body_chunk":
            chunks.append(event.body_chunk)
        elif kind == "end":
            end = event.end
    return head, chunks, end


def render(head: egress_pb2.ResponseHead, body: bytes, end: egress_pb2.ResponseEnd | None) -> str:
    lines = [f"HTTP {head.status} {head.reason}".rstrip()]
    lines += [f"{h.name}: {h.value}" for h in head.headers]
    text = body.decode("utf-8", "replace")
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[... {len(text) - MAX_RESULT_CHARS} more characters]"
    if end is not None and end.truncated:
        text += f"\n[body cut by the broker at {end.body_bytes} bytes]"
    elif end is None:
        text += "\n[the stream ended early]"
    return "\n".join(lines) + "\n\n" + text
