"""Accepting on a session's gRPC sockets (model.sock, gateway.sock, egress.sock, mcp.sock).

Each socket takes new connections at the session's connection rate, each checked as it is
accepted (a process of the session's own unit, api/accept.py); a connection is then counted
against the socket's connection limit (a full socket drops its least recently used connection,
api/limits.py), must open with the HTTP/2 preface within the handshake timeout, and is then
spliced to the one internal gRPC server from an abstract address naming a random nonce, which the
interceptor (api/sandbox_calls.py) maps back to :class:`SandboxPeer`. Every line a connection can
cause goes through the journal throttle (ironclawd/ratelog.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path

from ironclawd import ratelog
from ironclawd.api import control
from ironclawd.api.accept import PacedServer, serve_paced
from ironclawd.api.limits import HTTP2_PREFACE, Conn, ConnectionTable
from ironclawd.api.sockets import bind_unix_socket
from ironclawd.api.splice import splice_to
from ironclawd.config import SocketsConfig
from ironclawd.domain.session import unit_name

log = logging.getLogger("ironclawd.sandbox-api")

PREFIX = "ironclaw-sbx/"


@dataclass(frozen=True)
class SandboxPeer:
    """The session and socket a call came in on (never anything the caller said)."""

    sid: str
    socket: str
    conn: Conn | None = field(default=None, compare=False)


@dataclass
class _Socket:
    server: PacedServer
    table: ConnectionTable


class SessionSockets:
    """The listening sockets of every session, leading to the internal server."""

    def __init__(
        self, internal: Path, sessions_dir: Path, limits: SocketsConfig,
        peers: dict[str, SandboxPeer],
    ) -> None:  # fmt: skip
        self._internal = internal
        self._dir = sessions_dir
        self._limits = limits
        self._peers = peers
        self._sockets: dict[tuple[str, str], _Socket] = {}

    def path(self, sid: str, name: str) -> Path:
        return self._dir / sid / f"{name}.sock"

    async def open(self, sid: str, name: str) -> None:
        await self.close(sid, name)
        sock = bind_unix_socket(self.path(sid, name), mode=0o666, group=None)
        table = ConnectionTable(self._limits.max_connections)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._accept(sid, name, table, reader, writer)

        def admit(conn: socket.socket) -> bool:
            if control.peer_in_unit(conn, unit_name(sid)):
                return True
            ratelog.warning(log, sid, f"{name}.sock outsider",
                            "session %s: refused a %s.sock connection from outside its unit",
                            sid, name)  # fmt: skip
            return False

        server = serve_paced(handle, sock, self._limits, admit, sid=sid, name=f"{name}.sock")
        self._sockets[(sid, name)] = _Socket(server, table)

    async def close(self, sid: str, name: str) -> None:
        entry = self._sockets.pop((sid, name), None)
        if entry is not None:
            entry.server.close()
            entry.table.close_all()
            # asyncio.timeout, not wait_for: no task per socket (a stop closes ~2 a session).
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1):
                    await entry.server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.path(sid, name).unlink()

    async def close_all(self) -> None:
        for sid, name in list(self._sockets):
            await self.close(sid, name)

    async def _accept(
        self,
        sid: str,
        name: str,
        table: ConnectionTable,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        sock_name = f"{name}.sock"
        conn = Conn(close=writer.transport.abort)
        if table.admit(conn) is not None:
            ratelog.info(log, sid, f"{sock_name} full",
                         "session %s: %s has %d connections open: dropped the least recently "
                         "used for a new one", sid, sock_name,
                         self._limits.max_connections)  # fmt: skip
        try:
            first = await self._preface(sid, sock_name, reader, conn)
            if first is None or conn.closed:
                writer.transport.abort()
                return
            nonce = secrets.token_hex(16)
            self._peers[nonce] = SandboxPeer(sid, name, conn)
            try:
                await splice_to(self._internal, PREFIX + nonce, reader, writer, first=first)
            finally:
                self._peers.pop(nonce, None)
        finally:
            table.remove(conn)

    async def _preface(
        self, sid: str, sock_name: str, reader: asyncio.StreamReader, conn: Conn
    ) -> bytes | None:
        """The HTTP/2 preface, or None (logged) if the client does not send it in time."""
        timeout = self._limits.handshake_timeout_seconds
        try:
            first = await asyncio.wait_for(reader.readexactly(len(HTTP2_PREFACE)), timeout)
        except (TimeoutError, asyncio.IncompleteReadError, OSError):
            if conn.closed:  # dropped for a newer connection: already said
                return None
            ratelog.warning(log, sid, f"{sock_name} no preface",
                            "session %s: dropped a %s connection: no HTTP/2 preface within %g s",
                            sid, sock_name, timeout)  # fmt: skip
            return None
        if first != HTTP2_PREFACE:
            ratelog.warning(log, sid, f"{sock_name} not http2",
                            "session %s: dropped a %s connection: not HTTP/2 (starts %r)",
                            sid, sock_name, first[:16])  # fmt: skip
            return None
        return first
