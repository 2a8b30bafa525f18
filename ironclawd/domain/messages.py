"""Messages between operator and agent: validation and the ingest hash chain. Pure."""

from __future__ import annotations

import hashlib
import re
import struct
import unicodedata
from dataclasses import dataclass

from ironclawd.errors import InvalidArgument

MAX_MESSAGE_BYTES = 64 * 1024
MAX_CLIENT_ID = 64
CLIENT_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
GENESIS = b"\0" * 32
# C0/C1 controls other than tab and newline: refused in what an operator sends (they would
# restyle terminals); what the agent says back is shown escaped instead (ctl/render.visible).
_FORBIDDEN_CONTROLS = frozenset(range(0x00, 0x20)) - {0x09, 0x0A} | frozenset(range(0x7F, 0xA0))


@dataclass(frozen=True)
class Reply:
    """One outbound message as ingested by the host."""

    seq: int
    in_reply_to: int
    created_at: float
    body: str
    chain: bytes


def check_body(body: str) -> str:
    """Refuse an empty, oversized or malformed message, naming what was wrong."""
    if not body.strip():
        raise InvalidArgument("message: expected some text, got an empty message")
    size = len(body.encode("utf-8", "surrogatepass"))
    if size > MAX_MESSAGE_BYTES:
        raise InvalidArgument(
            f"message: expected at most {MAX_MESSAGE_BYTES} bytes of UTF-8, got {size}"
        )
    for index, ch in enumerate(body):
        code = ord(ch)
        if code in _FORBIDDEN_CONTROLS:
            raise InvalidArgument(
                f"message: control character U+{code:04X} at offset {index} "
                "(only tab and newline are allowed)"
            )
        if unicodedata.category(ch) == "Cs":
            raise InvalidArgument(f"message: lone surrogate at offset {index} (not valid UTF-8)")
    return body


def check_client_id(client_id: str) -> str:
    if client_id and not CLIENT_ID_RE.fullmatch(client_id):
        raise InvalidArgument(
            f"client id: expected 1-{MAX_CLIENT_ID} characters of [A-Za-z0-9._:-], "
            f"got {client_id[:80]!r}"
        )
    return client_id


def chain_link(previous: bytes, seq: int, in_reply_to: int, created_at: float, body: str) -> bytes:
    """The hash that binds one ingested reply to everything ingested before it."""
    digest = hashlib.sha256(previous)
    digest.update(struct.pack(">QQd", seq, in_reply_to, created_at))
    digest.update(body.encode("utf-8", "surrogatepass"))
    return digest.digest()
