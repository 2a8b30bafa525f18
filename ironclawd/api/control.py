"""Per-session control sockets: ``/run/ironclaw/sessions/<sid>/control.sock``.

The directory is the only host directory mounted into the session's sandbox (read-only), so the
agent can connect but never create or replace a socket there. A connection is accepted only from
a process in that session's own unit (its cgroup, read from /proc/<peer pid>/cgroup via
SO_PEERCRED): another session, or a host user who guessed the path, is turned away.

The directory is reused across daemon restarts, never recreated: the sandbox's bind mount refers
to the directory itself, so a new directory would be invisible to a running sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ironclawd.api.sockets import bind_unix_socket, ensure_private_dir
from ironclawd.domain.session import check_sid, unit_name
from ironclawd.errors import HostError
from ironclawd.ports import AgentHello

log = logging.getLogger("ironclawd.control")

CONTROL_SOCKET = "control.sock"
HELLO_TIMEOUT = 10.0
MAX_LINE = 256


@dataclass
class _Channel:
    server: asyncio.Server
    hello: asyncio.Future[AgentHello]
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    writers: set[asyncio.StreamWriter] = field(default_factory=set)
    closing: bool = False


class ControlServer:
    def __init__(self, sessions_dir: Path) -> None:
        self._dir = sessions_dir
        self._channels: dict[str, _Channel] = {}

    def _session_dir(self, sid: str) -> Path:
        return self._dir / check_sid(sid)

    async def open(self, sid: str) -> Path:
        await self.close_listener(sid)
        ensure_private_dir(self._dir, 0o755)
        directory = self._session_dir(sid)
        ensure_private_dir(directory, 0o755)
        # 0666: the sandbox's host-side processes run as an unprivileged uid of runsc's choosing;
        # who may talk here is decided by the cgroup check below, not by the mode.
        sock = bind_unix_socket(directory / CONTROL_SOCKET, mode=0o666, group=None)
        loop = asyncio.get_running_loop()
        hello: asyncio.Future[AgentHello] = loop.create_future()
        channel: _Channel

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(sid, channel, reader, writer)

        server = await asyncio.start_unix_server(handle, sock=sock, limit=MAX_LINE)
        channel = _Channel(server, hello)
        self._channels[sid] = channel
        return directory

    async def _serve(
        self,
        sid: str,
        channel: _Channel,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        sock: socket.socket = writer.get_extra_info("socket")
        if not _peer_in_unit(sock, unit_name(sid)):
            log.warning("session %s: refused a control connection from outside its unit", sid)
            writer.close()
            return
        try:
            line = await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT)
            hello = _parse_hello(line)
        except (TimeoutError, ValueError, OSError) as exc:
            log.warning("session %s: bad control hello: %s", sid, exc)
            writer.close()
            return
        channel.writers.add(writer)
        if not channel.hello.done():
            channel.hello.set_result(hello)
        try:
            while await reader.read(4096):
                pass  # no agent-to-host commands yet; reading keeps the liveness signal
        except OSError:
            pass
        finally:
            channel.writers.discard(writer)
            writer.close()
            if not channel.closing:
                channel.disconnected.set()

    async def wait_hello(self, sid: str, timeout: float) -> AgentHello:
        channel = self._require(sid)
        return await asyncio.wait_for(asyncio.shield(channel.hello), timeout)

    async def wait_disconnect(self, sid: str) -> None:
        await self._require(sid).disconnected.wait()

    def is_connected(self, sid: str) -> bool:
        channel = self._channels.get(sid)
        return channel is not None and bool(channel.writers)

    async def close_listener(self, sid: str) -> None:
        """Stop serving a session's socket but leave its directory (daemon shutdown)."""
        channel = self._channels.pop(sid, None)
        if channel is None:
            return
        channel.closing = True
        channel.server.close()
        for writer in list(channel.writers):
            writer.close()
        if not channel.hello.done():
            channel.hello.cancel()
        channel.disconnected.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(channel.server.wait_closed(), 2)

    async def close(self, sid: str) -> None:
        await self.close_listener(sid)
        directory = self._session_dir(sid)
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(directory):
                if not entry.is_dir(follow_symlinks=False):
                    os.unlink(entry.path)
            os.rmdir(directory)

    async def close_all_listeners(self) -> None:
        for sid in list(self._channels):
            await self.close_listener(sid)

    def list_dirs(self) -> list[str]:
        try:
            return sorted(e.name for e in os.scandir(self._dir) if e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            return []

    def _require(self, sid: str) -> _Channel:
        try:
            return self._channels[sid]
        except KeyError:
            raise HostError(f"session {sid}: control socket is not open") from None


def _parse_hello(line: bytes) -> AgentHello:
    words = line.decode("ascii", "strict").split()
    if len(words) != 3 or words[0] != "hello":
        raise ValueError(f"expected 'hello <pid> <uid>', got {line[:60]!r}")
    return AgentHello(pid=int(words[1]), uid=int(words[2]))


def _peer_in_unit(sock: socket.socket, unit: str) -> bool:
    """Whether the connecting process belongs to ``unit`` (proc(5) /proc/<pid>/cgroup)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid = struct.unpack("3i", raw)[0]
    if pid <= 0:
        return False
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
    suffix = f"/{unit}"
    return any(line.rstrip().endswith(suffix) for line in text.splitlines())
