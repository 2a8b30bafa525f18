"""Splice an accepted connection to an internal gRPC server from a socket bound to an abstract
address the daemon chose: grpcio reports that address as the call's ``peer()``, which is how a
servicer learns who is on the other end (see docs/admin-identity.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from pathlib import Path

log = logging.getLogger("ironclawd.splice")


async def splice_to(
    internal: Path,
    abstract_name: str,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    first: bytes = b"",
) -> None:
    """Pump bytes both ways between the client and ``internal`` until either side closes;
    ``first``: bytes already read from the client, sent upstream before the rest."""
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.bind("\0" + abstract_name)
        upstream.setblocking(False)
        await asyncio.get_running_loop().sock_connect(upstream, str(internal))
    except OSError as exc:
        upstream.close()
        log.error("connection dropped: connecting to internal server %s: %s", internal, exc)
        writer.close()
        return
    up_reader, up_writer = await asyncio.open_unix_connection(sock=upstream)
    up_writer.write(first)
    await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer), return_exceptions=True)


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(256 * 1024):
            dst.write(data)
            await dst.drain()
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if dst.can_write_eof():
                dst.write_eof()
        dst.close()
