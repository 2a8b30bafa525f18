"""Splice an accepted connection to an internal gRPC server from a socket bound to an abstract
address the daemon chose: grpcio reports that address as the call's ``peer()``, which is how a
servicer learns who is on the other end (see docs/admin-identity.md).

Every byte of every admin and sandbox call passes here, so the relay runs in transport callbacks
(``asyncio.Protocol``): a chunk received on one side is written to the other at once, with no
stream buffer, task wake-up or drain in between. Flow control is the transports' own: a side
whose write buffer fills pauses reading on the other side until it has drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from pathlib import Path

log = logging.getLogger("ironclawd.splice")


class _Side(asyncio.Protocol):
    """One end of a splice: what it receives goes to the other end's transport. ``transport``
    and ``other`` are set before any byte moves (``splice_to``)."""

    transport: asyncio.Transport
    other: _Side

    def __init__(self, lost: asyncio.Event) -> None:
        self._lost = lost
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # a stream socket's transport
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.other.transport.write(data)

    def eof_received(self) -> bool:
        # One side is done: the other gets the EOF, then both close once their writes drained
        # (what a closed gRPC connection means to either party).
        peer = self.other.transport
        with contextlib.suppress(OSError, RuntimeError):
            if peer.can_write_eof():
                peer.write_eof()
        peer.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.other.transport.close()
        if self.other.closed:
            self._lost.set()

    def pause_writing(self) -> None:
        self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        self.other.transport.resume_reading()


async def splice_to(
    internal: Path,
    abstract_name: str,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    first: bytes = b"",
) -> None:
    """Relay bytes both ways between the client and ``internal`` until either side closes;
    ``first``: bytes already read from the client, sent upstream before the rest."""
    loop = asyncio.get_running_loop()
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.bind("\0" + abstract_name)
        upstream.setblocking(False)
        await loop.sock_connect(upstream, str(internal))
    except OSError as exc:
        upstream.close()
        log.error("connection dropped: connecting to internal server %s: %s", internal, exc)
        writer.close()
        return
    lost = asyncio.Event()
    client, server = _Side(lost), _Side(lost)
    down = writer.transport
    if not isinstance(down, asyncio.Transport):  # a stream over a Unix socket always is
        writer.close()
        upstream.close()
        return
    # The server speaks first (its SETTINGS): that may arrive before the client's end is handed
    # over below, and goes straight to the client's transport.
    client.transport, client.other, server.other = down, server, client
    try:
        await loop.create_unix_connection(lambda: server, sock=upstream)
    except OSError as exc:
        log.error("connection dropped: relaying to internal server %s: %s", internal, exc)
        writer.close()
        return
    if down.is_closing():
        server.transport.abort()
        return
    # Take the client's transport from its stream. Nothing runs on the loop from here to the
    # writes below (no await suspends): bytes the stream already holds go upstream first, in
    # order, and only then does the transport read again, now into the relay. Pausing and
    # resuming re-arms the reader even if the client's EOF came while the stream had it.
    down.pause_reading()
    down.set_protocol(client)
    try:
        reader.feed_eof()
        try:
            held = await reader.read()
        except OSError:  # the client's connection failed while the stream had it
            return
        server.transport.write(first + held)
        down.resume_reading()
        await lost.wait()
    finally:
        # Cancelled (the daemon stops) or the stream held an error: both ends go at once.
        if not lost.is_set():
            down.abort()
            server.transport.abort()
