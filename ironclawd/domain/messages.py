"""Messages between operator and agent: validation and the ingest hash chain. Pure."""

from __future__ import annotations

import hashlib
import math
import struct
import unicodedata
from dataclasses import dataclass

from ironclawd import lazy_re
from ironclawd.errors import InvalidArgument

MAX_MESSAGE_BYTES = 64 * 1024
MAX_CLIENT_ID = 64
CLIENT_ID_RE = lazy_re.compile(r"[A-Za-z0-9._:-]{1,64}")
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


@dataclass(frozen=True)
class QueueLimits:
    """What one session's agent may put in its outbound queue (``[queues]`` in the config)."""

    max_reply_bytes: int = 1024 * 1024  # a longer body is refused (a placeholder is ingested)
    rows_per_read: int = 1000  # rows ingested per read of the file
    max_rows: int = 1_000_000  # replies per session; past it nothing more is ingested
    # What the state DB holds of a session's replies (domain/reply_bounds.py stored_bytes); and
    # replies to one inbound message (the agent writes one). Past either nothing more is
    # ingested: the rest waits in the session's outbound queue, on its own tmpfs.
    max_ingested_bytes: int = 256 * 1024 * 1024
    max_replies_per_message: int = 16
    outbound_bytes: int = 64 * 1024 * 1024  # the outbound tmpfs's size (the box gets ENOSPC)
    outbound_files: int = 64  # the outbound tmpfs's inodes (files and directories)
    read_timeout_seconds: float = 30.0  # one read of the file; its session waits, none else
    prune_after_rows: int = 256  # tell the agent to drop what was ingested this often (0: never)


# Largest in_reply_to accepted: an inbound seq fits in a signed 64-bit SQLite integer, and the
# chain packs it unsigned.
MAX_SEQ = 2**63 - 1


def accept_row(
    seq: int, in_reply_to: object, created_at: object, body: object, max_body: int
) -> tuple[tuple[int, int, float, str], str]:
    """One outbound row as the host ingests it, and why it was refused ("" if it was not).

    The agent is untrusted and SQLite types are advisory: a row whose in_reply_to is not an
    integer in 0..MAX_SEQ, whose created_at is not a finite number, or whose body is not
    UTF-8 text of at most ``max_body`` bytes (``body`` is its bytes, or None when it was too
    long to fetch) becomes a placeholder that names the problem, so the rows after it still
    flow. Deterministic, so ``session verify`` recomputes the same placeholder from the file."""
    problem = ""
    if isinstance(in_reply_to, bool) or not isinstance(in_reply_to, int):
        problem = "in_reply_to is not an integer"
    elif not 0 <= in_reply_to <= MAX_SEQ:
        problem = f"in_reply_to {in_reply_to} is out of range"
    elif isinstance(created_at, bool) or not isinstance(created_at, int | float):
        problem = "created_at is not a number"
    elif not math.isfinite(created_at) or abs(created_at) > 1e15:
        problem = "created_at is not a finite time"
    elif body is None or not isinstance(body, bytes) or len(body) > max_body:
        problem = f"body is not text of at most {max_body} bytes"
    else:
        try:
            text = body.decode("utf-8", "strict")
        except UnicodeDecodeError:
            problem = "body is not valid UTF-8"
        else:
            return (seq, int(in_reply_to), float(created_at), text), ""
    return (seq, 0, 0.0, f"[ironclawd refused reply {seq}: {problem}]"), problem
