"""Per-session control sockets: ``/run/ironclaw/sessions/<sid>/control.sock``.

The directory is the only host directory mounted into the session's sandbox (read-only), so the
agent can connect but never create or replace a socket there. A connection is accepted only from
a process in that session's own unit (its cgroup, read from /proc/<peer pid>/cgroup via
SO_PEERCRED): another session, or a host user who guessed the path, is turned away. The whole
cgroup path must match, not just its last component: systemd delegates cgroup subtrees to
unprivileged users (user@<uid>.service has Delegate=yes), and a user may name a cgroup in theirs
"ironclaw-sbx-<sid>.service".

The directory is reused across daemon restarts, never recreated: the sandbox's bind mount refers
to the directory itself, so a new directory would be invisible to a running sandbox.

Everything on the socket is bounded: new connections accepted at ``connections_per_second``
(further connects wait in the kernel's backlog, api/accept.py), at most
``max_control_connections`` connections (a new one pushes out the oldest that has not said hello
yet, else it is refused: the agent's own connection, which said hello long ago, is never pushed
out), a hello within the handshake timeout, lines of at most MAX_LINE bytes read at the session's
call rate (``calls_per_second``, its further lines wait in the socket), and a peer that stops
reading cannot hold up ``send`` for longer than SEND_TIMEOUT. Every line the box can cause is
logged through the throttle (ironclawd/ratelog.py).

A clean daemon stop hands each session's listening socket and its agent's connection to systemd's
file descriptor store (``hand_over``), and the next start takes them back (``restore``): the
agent never sees its connection end, so a restart costs the sandboxes nothing. A restored
connection is checked again like a new one (its peer must still be in the session's unit). The
stopping daemon stops reading the connections it hands over; one it had read a line from that it
had not finished acting on is marked, and the next daemon reads that session's outbound queue
again in full ("resync"). The saved name also carries the protocol version the agent's hello
named (ironclawd/domain/agent_protocol.py), so a restored connection keeps it without a hello;
an agent of a version this daemon does not speak is refused, at its hello as at its restore.
The next daemon's first line on a restored connection is "restarted 0":
the agent's gRPC connections to the session's other sockets ended with the old daemon. Anything
that cannot be restored is closed, and the agent reconnects and says hello as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import posixpath
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ironclawd import paths, ratelog
from ironclawd.api.accept import PacedServer, serve_paced
from ironclawd.api.limits import TokenBucket
from ironclawd.api.sockets import bind_unix_socket, ensure_private_dir
from ironclawd.config import SocketsConfig
from ironclawd.domain.agent_protocol import (
    VERSION_DIGITS,
    is_version_word,
    parse_version_word,
    refusal,
    version_word,
)
from ironclawd.domain.session import check_sid, unit_name
from ironclawd.errors import HostError, IronclawError
from ironclawd.ports import RESYNC, AgentHello, ControlListener

log = logging.getLogger("ironclawd.control")

CONTROL_SOCKET = "control.sock"
# A pooled sandbox's agent waits for its claim in a blocked read here (agent/main.py): the
# socket exists only while the sandbox is pooled, and ``wake`` answers it with CLAIMED_LINE.
CLAIM_SOCKET = "claim.sock"
CLAIMED_LINE = b"claimed\n"
MAX_LINE = 256
SEND_TIMEOUT = 5.0
# Names in the fd store: "control.<sid>" (the listener), "control.<sid>.<pid>.<uid>[.v<n>]" (the
# agent's connection, with what its hello said: ".v<n>" its protocol version, none for 1),
# ending ".resync" if what was read from it may not all have been acted on.
STORE_PREFIX = "control."
# The first line on a restored connection: the agent drops its channels (agent/loop.py RESTARTED).
RESTARTED_LINE = b"restarted 0\n"
RESYNC_SUFFIX = "resync"


@dataclass(frozen=True)
class _Kept:
    """An agent's connection kept through a restart."""

    sock: socket.socket
    hello: AgentHello
    resync: bool

    def name(self, sid: str) -> str:
        name = f"{_listener_name(sid)}.{self.hello.pid}.{self.hello.uid}"
        if version := version_word(self.hello.protocol):
            name = f"{name}.{version}"
        return f"{name}.{RESYNC_SUFFIX}" if self.resync else name


def _listener_name(sid: str) -> str:
    return f"{STORE_PREFIX}{sid}"


@dataclass
class Restored:
    """What the fd store gave back for one session."""

    listener: socket.socket | None = None
    connections: list[_Kept] = field(default_factory=list)

    def close(self) -> None:
        for sock in [self.listener, *(c.sock for c in self.connections)]:
            if sock is not None:
                sock.close()


@dataclass
class _Channel:
    server: PacedServer
    hello: asyncio.Future[AgentHello]
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    writers: set[asyncio.StreamWriter] = field(default_factory=set)
    waiting: list[asyncio.StreamWriter] = field(default_factory=list)  # no hello yet, oldest first
    hellos: dict[asyncio.StreamWriter, AgentHello] = field(default_factory=dict)
    readers: dict[asyncio.StreamWriter, asyncio.StreamReader] = field(default_factory=dict)
    acting: set[asyncio.StreamWriter] = field(default_factory=set)  # a line read, not acted on
    restoring: set[asyncio.Task[None]] = field(default_factory=set)
    closing: bool = False


@dataclass
class _Claim:
    """A pooled sandbox's claim.sock and its agent's waiting connections, oldest first."""

    server: PacedServer
    waiting: list[asyncio.StreamWriter] = field(default_factory=list)
    # Set when an agent connects, and when the socket stops being served (``wait_claim``).
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class ControlServer:
    def __init__(self, sessions_dir: Path, limits: SocketsConfig = SocketsConfig()) -> None:  # noqa: B008 (frozen)
        self._dir = sessions_dir
        self._limits = limits
        self._channels: dict[str, _Channel] = {}
        self._claims: dict[str, _Claim] = {}
        self._claim_lost: list[Callable[[str], None]] = []
        self._listener: ControlListener | None = None
        self._unsettled: Callable[[str], bool] = lambda sid: False  # set_unsettled
        self._restored: dict[str, Restored] = {}
        # Each session's lines, all its connections together (``_paced``).
        self._lines: dict[str, TokenBucket] = {}

    def set_listener(self, listener: ControlListener) -> None:
        self._listener = listener

    def set_unsettled(self, check: Callable[[str], bool]) -> None:
        self._unsettled = check

    async def send(self, sid: str, event: str, value: int) -> bool:
        channel = self._channels.get(sid)
        if channel is None or not channel.writers:
            return False
        line = f"{event} {value}\n".encode("ascii")
        for writer in list(channel.writers):
            try:
                writer.write(line)
                await asyncio.wait_for(writer.drain(), SEND_TIMEOUT)
            except (OSError, TimeoutError) as exc:
                # A peer that stops reading must not hold up the session's messages.
                ratelog.warning(log, sid, "control.sock send failed",
                                "session %s: dropped a control connection: sending %s: %s", sid,
                                event, type(exc).__name__)  # fmt: skip
                channel.writers.discard(writer)
                writer.transport.abort()
        return bool(channel.writers)

    async def _announce(self, sid: str, event: str, value: int) -> None:
        if self._listener is not None:
            try:
                await self._listener(sid, event, value)
            except Exception:  # a listener bug must not kill the agent's connection
                log.exception("session %s: handling %s %d", sid, event, value)

    def _session_dir(self, sid: str) -> Path:
        return self._dir / check_sid(sid)

    def make_dir(self, sid: str) -> Path:
        ensure_private_dir(self._dir, 0o711)
        directory = self._session_dir(sid)
        ensure_private_dir(directory, 0o711)
        return directory

    async def open_claim(self, sid: str) -> Path:
        """A pooled sandbox's socket directory, serving only claim.sock: its agent connects and
        waits there (no polling) until ``wake``. Only the sandbox's own unit may connect, as on
        control.sock; nothing is read from a connection, and the host sends only CLAIMED_LINE."""
        directory = self.make_dir(sid)
        await self._close_claim(sid)
        sock = bind_unix_socket(directory / CLAIM_SOCKET, mode=0o666, group=None)
        claim: _Claim

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._hold(sid, claim, reader, writer)

        admit = _admit(sid, "claim")
        claim = _Claim(serve_paced(handle, sock, self._limits, admit, sid=sid, name=CLAIM_SOCKET,
                                   limit=MAX_LINE))  # fmt: skip
        self._claims[sid] = claim
        return directory

    async def _hold(
        self, sid: str, claim: _Claim, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if len(claim.waiting) >= self._limits.max_control_connections:
            claim.waiting.pop(0).transport.abort()  # the oldest: a new one is the live agent
        claim.waiting.append(writer)
        claim.changed.set()
        try:
            await reader.read(1)  # the agent sends nothing: a byte or the end ends its wait
        except OSError:
            pass
        finally:
            # Still listed: the agent's side ended it (not a wake, a teardown or a newer
            # connection pushing it out, which take it off the list first).
            if writer in claim.waiting:
                claim.waiting.remove(writer)
                writer.transport.abort()
                if not claim.waiting and self._claims.get(sid) is claim:
                    for hook in self._claim_lost:
                        hook(sid)

    def on_claim_lost(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(sid)`` when the last agent connection to a pooled sandbox's claim.sock
        ends from the sandbox's side while nobody claimed it: its agent died (or broke the
        protocol), and the sandbox cannot be claimed."""
        self._claim_lost.append(hook)

    async def wait_claim(self, sid: str) -> None:
        """Until an agent from ``sid``'s own unit waits on its claim.sock. A pooled sandbox
        counts as ready only then: one claimed while its agent still booted found the socket
        gone (a claim stops serving it) and polled its key file only after 5 s of retries."""
        claim = self._claims.get(sid)
        while claim is not None and self._claims.get(sid) is claim:
            if claim.waiting:
                return
            claim.changed.clear()
            await claim.changed.wait()
        raise HostError(f"session {sid}: claim socket not served (or closed before its agent "
                        "connected)")  # fmt: skip

    def claim_waiting(self, sid: str) -> bool:
        """Whether an agent from ``sid``'s own unit holds a connection to its claim.sock now.
        That connection ends with the agent (its sandbox dying ends it), so while it is held the
        sandbox runs, and a claim needs no question to systemd (~2 ms on D-Bus)."""
        claim = self._claims.get(sid)
        return claim is not None and bool(claim.waiting)

    async def wake(self, sid: str) -> None:
        """Tell a pooled sandbox's waiting agent that a session claimed it (its key, queues and
        sockets are in place), then stop serving claim.sock. Nothing to do if it is not pooled."""
        await self._end_claim(sid, CLAIMED_LINE)

    async def _close_claim(self, sid: str) -> None:
        await self._end_claim(sid, None)

    async def _end_claim(self, sid: str, line: bytes | None) -> None:
        """Stop serving ``sid``'s claim.sock. With ``line`` (a wake), each waiting agent gets it
        before its connection ends, and nothing waits for the server to close: the claim's
        hello is waiting (from Python 3.12 on, ``wait_closed`` also waits for the connections).
        Without (a teardown), the connections are cut and the close is waited for, bounded."""
        claim = self._claims.pop(sid, None)
        if claim is None:
            return
        for writer in claim.waiting:
            if line is None:
                writer.transport.abort()
                continue
            with contextlib.suppress(OSError, RuntimeError):
                writer.write(line)
            writer.close()  # after what was written
        claim.waiting.clear()
        claim.changed.set()
        claim.server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._session_dir(sid) / CLAIM_SOCKET)
        if line is None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await claim.server.wait_closed()

    async def open(self, sid: str) -> Path:
        await self._close_channel(sid)  # not claim.sock: a claim opens this before ``wake``
        ensure_private_dir(self._dir, 0o711)
        directory = self._session_dir(sid)
        ensure_private_dir(directory, 0o711)
        restored = self._restored.pop(sid, Restored())
        path = directory / CONTROL_SOCKET
        sock = restored.listener
        restored.listener = None
        if sock is None or not _listens_at(sock, path):
            if sock is not None:
                sock.close()
            # 0666: the sandbox's host-side processes run as an unprivileged uid of runsc's
            # choosing; who may talk here is decided by the cgroup check below, not by the mode.
            sock = bind_unix_socket(path, mode=0o666, group=None)
        loop = asyncio.get_running_loop()
        hello: asyncio.Future[AgentHello] = loop.create_future()
        channel: _Channel

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(sid, channel, reader, writer)

        admit = _admit(sid, "control")
        server = serve_paced(handle, sock, self._limits, admit, sid=sid, name=CONTROL_SOCKET,
                             limit=MAX_LINE)  # fmt: skip
        channel = _Channel(server, hello)
        self._channels[sid] = channel
        for kept in restored.connections:
            reader, writer = await asyncio.open_unix_connection(sock=kept.sock, limit=MAX_LINE)
            task = asyncio.create_task(self._serve(sid, channel, reader, writer, kept))
            channel.restoring.add(task)
            task.add_done_callback(channel.restoring.discard)
        return directory

    def restore(self, taken: dict[str, list[socket.socket]]) -> int:
        """Keep what the fd store gave back under this server's names, for ``open`` to use;
        close the rest. Returns how many agents' connections were restored."""
        count = 0
        for name, socks in taken.items():
            parsed = _parse_store_name(name)
            if parsed is None or len(socks) != 1:
                log.warning("fd store: %d descriptor(s) under %r: not ours, closed", len(socks),
                            name)  # fmt: skip
                for sock in socks:
                    sock.close()
                continue
            sid, said, resync = parsed
            entry = self._restored.setdefault(sid, Restored())
            if said is None:
                if entry.listener is not None:
                    entry.listener.close()
                entry.listener = socks[0]
            else:
                entry.connections.append(_Kept(socks[0], said, resync))
                count += 1
        return count

    def discard_restored(self) -> None:
        """Close what was restored for sessions that were not opened again (removed meanwhile,
        or failed to adopt): their agents, if any, see the connection end."""
        for entry in self._restored.values():
            entry.close()
        self._restored.clear()

    async def hand_over(self) -> list[tuple[str, list[int]]]:
        """At a clean stop, once nothing else will use the sockets: every session's listener
        and its agents' connections that said hello and have nothing left to send, named for
        the fd store. Those connections are read no more from here on (what the agent writes
        waits in the socket for the next daemon). The caller stores them, then
        ``close_all_listeners`` closes this process's copies (systemd's keep them open)."""
        kept: list[tuple[str, asyncio.StreamWriter]] = []
        for sid, channel in self._channels.items():
            for writer in channel.hellos:
                if writer.is_closing() or writer.transport.get_write_buffer_size():
                    continue  # what is not sent yet would be lost: let the agent reconnect
                transport = writer.transport
                assert isinstance(transport, asyncio.Transport)  # a stream socket's
                transport.pause_reading()
                kept.append((sid, writer))
        # A line already read lets its task run on the next turns of the loop: after them, a
        # connection is clean if nothing it sent is in hand, acted on or not.
        for _ in range(2):
            await asyncio.sleep(0)
        handed: list[tuple[str, list[int]]] = []
        for sid, channel in self._channels.items():
            listener = channel.server.sockets
            if len(listener) == 1:
                handed.append((_listener_name(sid), [listener[0].fileno()]))
        for sid, writer in kept:
            open_channel = self._channels.get(sid)
            hello = open_channel.hellos.get(writer) if open_channel is not None else None
            if open_channel is None or hello is None or writer.is_closing():
                continue  # it ended during those turns (its task let go of it): nothing to keep
            acting, readers = open_channel.acting, open_channel.readers
            # Or replies it announced were not all taken (a hold, a retried ingest): the
            # next daemon would otherwise take them only at the agent's next announcement.
            resync = writer in acting or _buffered(readers.get(writer)) or self._unsettled(sid)
            sock: socket.socket = writer.get_extra_info("socket")
            entry = _Kept(sock, hello, resync)
            handed.append((entry.name(sid), [sock.fileno()]))
        # Taken back at start but not yet opened (a stop while adopting): handed on as they are.
        for sid, restored in self._restored.items():
            if restored.listener is not None:
                handed.append((_listener_name(sid), [restored.listener.fileno()]))
            for conn in restored.connections:
                handed.append((conn.name(sid), [conn.sock.fileno()]))
        return handed

    async def _serve(
        self,
        sid: str,
        channel: _Channel,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        restored: _Kept | None = None,
    ) -> None:
        sock: socket.socket = writer.get_extra_info("socket")
        # A new connection was checked as it was accepted (``_admit``); a restored one is here.
        if restored is not None and not peer_in_unit(sock, unit_name(sid)):
            ratelog.warning(log, sid, "control.sock outsider",
                            "session %s: refused a control connection from outside its unit",
                            sid)  # fmt: skip
            writer.transport.abort()
            return
        if not self._make_room(sid, channel):
            writer.transport.abort()
            return
        hello = restored.hello if restored else await self._hello(sid, channel, reader, writer)
        if hello is None:
            return
        if not self._speaks(sid, channel, hello):
            writer.transport.abort()
            return
        if restored is not None:
            # Before any other line: the agent's gRPC connections to the old daemon's sockets
            # ended with it, and its client would find that out only by failing a call on each.
            writer.write(RESTARTED_LINE)
        channel.writers.add(writer)
        channel.hellos[writer] = hello
        channel.readers[writer] = reader
        if channel.disconnected.is_set() and not channel.closing:
            # The agent is back (the daemon dropped it for not reading, say): a new wait for
            # its last connection to end begins.
            channel.disconnected = asyncio.Event()
        if not channel.hello.done():
            channel.hello.set_result(hello)
        try:
            channel.acting.add(writer)
            await self._first_news(sid, hello, restored)
            channel.acting.discard(writer)
            while line := await reader.readline():
                channel.acting.add(writer)
                try:
                    await self._paced(sid)
                    await self._act(sid, line)
                finally:
                    channel.acting.discard(writer)
        except (OSError, ValueError):
            pass  # ValueError: a line over MAX_LINE; the connection is dropped
        finally:
            channel.writers.discard(writer)
            channel.hellos.pop(writer, None)
            channel.readers.pop(writer, None)
            channel.acting.discard(writer)
            writer.close()
            # Every connection comes from inside the unit, so the sandbox is gone only when the
            # last one is: an extra connection that says hello and leaves is not an exit.
            if not channel.closing and not channel.writers:
                channel.disconnected.set()

    async def _paced(self, sid: str) -> None:
        """Wait until the session's line rate takes another line. Each line made the daemon act
        at once, and a read of the socket (some 43,000 short lines) was all acted on before the
        event loop took another turn: a box writing lines it could not parse held the loop for
        a second at a time (found by a review). Its further lines wait in the socket."""
        rate = self._limits.calls_per_second
        lines = self._lines.setdefault(sid, TokenBucket(rate, 2 * rate))
        while not lines.take():
            ratelog.info(log, sid, "control.sock paced",
                         "session %s: control.sock over %g lines a second: its next lines wait",
                         sid, rate)  # fmt: skip
            await asyncio.sleep(lines.wait_seconds())

    def _speaks(self, sid: str, channel: _Channel, hello: AgentHello) -> bool:
        """Whether this daemon speaks the protocol version the agent named (in its hello, or in
        the name of a restored connection). An agent of another version (frozen into another
        ironclawd version's package, adopted after an upgrade or a downgrade) is refused before
        anything is said to it or read from it, and the wait for the session's hello fails with
        the reason: its session is failed, never run half-understood."""
        why = refusal(sid, hello.protocol)
        if why is None:
            return True
        ratelog.warning(log, sid, "control.sock protocol",
                        "session %s: refused the control connection of agent pid %d: %s", sid,
                        hello.pid, why)  # fmt: skip
        if not channel.hello.done():
            channel.hello.set_exception(HostError(why))
            channel.hello.exception()  # seen here; a wait for it still raises it
        return False

    async def _first_news(self, sid: str, hello: AgentHello, restored: _Kept | None) -> None:
        """What a new or restored connection means for the session's outbound queue."""
        if restored is None:
            if hello.outbound_seq:
                await self._announce(sid, "outbound", hello.outbound_seq)
            return
        again = ": reading its outbound queue again" if restored.resync else ""
        log.info("session %s: control connection of agent pid %d restored from the fd store%s",
                 sid, hello.pid, again)  # fmt: skip
        if restored.resync:
            await self._announce(sid, RESYNC, 0)

    async def _act(self, sid: str, line: bytes) -> None:
        try:
            event, value = _parse_event(line)
        except ValueError as exc:
            ratelog.warning(log, sid, "control.sock bad line",
                            "session %s: ignoring control line: %s", sid, exc)  # fmt: skip
            return
        await self._announce(sid, event, value)

    async def _hello(
        self,
        sid: str,
        channel: _Channel,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> AgentHello | None:
        """The connection's hello, or None (and the connection closed) if it does not say it
        in time or is dropped for a newer connection meanwhile."""
        channel.waiting.append(writer)
        try:
            line = await asyncio.wait_for(reader.readline(), self._limits.handshake_timeout_seconds)
            hello = _parse_hello(line)
        except (TimeoutError, ValueError, OSError) as exc:
            if not writer.is_closing():
                ratelog.warning(log, sid, "control.sock bad hello",
                                "session %s: bad control hello: %s", sid, exc)  # fmt: skip
            writer.transport.abort()
            return None
        finally:
            with contextlib.suppress(ValueError):
                channel.waiting.remove(writer)
        return None if writer.is_closing() else hello

    def _make_room(self, sid: str, channel: _Channel) -> bool:
        """Whether a new connection may be served: over the limit, the oldest one still
        waiting for its hello is dropped for it; if every one has said hello, it is refused."""
        if len(channel.writers) + len(channel.waiting) < self._limits.max_control_connections:
            return True
        if channel.waiting:
            channel.waiting.pop(0).transport.abort()
            ratelog.info(log, sid, "control.sock full",
                         "session %s: control.sock full: dropped the oldest connection that "
                         "has not said hello", sid)  # fmt: skip
            return True
        ratelog.warning(log, sid, "control.sock full",
                        "session %s: refused a control connection: %d open", sid,
                        len(channel.writers))  # fmt: skip
        return False

    async def wait_hello(self, sid: str) -> AgentHello:
        channel = self._require(sid)
        return await asyncio.shield(channel.hello)

    async def wait_disconnect(self, sid: str) -> None:
        await self._require(sid).disconnected.wait()

    def connected(self, sid: str) -> bool:
        channel = self._channels.get(sid)
        return channel is not None and not channel.closing and bool(channel.writers)

    async def close_listener(self, sid: str) -> None:
        """Stop serving a session's sockets but leave its directory (daemon shutdown)."""
        await self._close_claim(sid)
        await self._close_channel(sid)

    async def _close_channel(self, sid: str) -> None:
        channel = self._channels.pop(sid, None)
        if channel is None:
            return
        channel.closing = True
        channel.server.close()
        for task in channel.restoring:
            task.cancel()
        for writer in [*channel.writers, *channel.waiting]:
            writer.close()
        if not channel.hello.done():
            # A wait for the hello ends with an error that names why, not a CancelledError in
            # a caller nobody cancelled (``exception()`` marks it seen if nobody waits).
            channel.hello.set_exception(
                HostError(f"session {sid}: control socket closed before its agent said hello")
            )
            channel.hello.exception()
        channel.disconnected.set()
        with contextlib.suppress(Exception):  # asyncio.timeout: no task (one a session at stop)
            async with asyncio.timeout(2):
                await channel.server.wait_closed()

    async def close(self, sid: str) -> None:
        await self.close_listener(sid)
        # What the fd store gave back for it and ``open`` has not taken (a session settled while
        # the start adopts the others): the listener's file is removed below, so a later
        # ``open`` must bind a new one, not take this (its name still reads as the path).
        self._restored.pop(sid, Restored()).close()
        self._lines.pop(sid, None)
        directory = self._session_dir(sid)
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(directory):
                if not entry.is_dir(follow_symlinks=False):
                    os.unlink(entry.path)
            os.rmdir(directory)

    async def close_all_listeners(self) -> None:
        for sid in list(self._channels) + list(self._claims):
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


def _admit(sid: str, kind: str) -> Callable[[socket.socket], bool]:
    """The check of a connection to ``sid``'s control.sock or claim.sock as it is accepted
    (api/accept.py): only its own unit's spend the socket's connection rate."""

    def admit(sock: socket.socket) -> bool:
        if peer_in_unit(sock, unit_name(sid)):
            return True
        ratelog.warning(log, sid, f"{kind}.sock outsider",
                        "session %s: refused a %s connection from outside its unit", sid,
                        kind)  # fmt: skip
        return False

    return admit


def _listens_at(sock: socket.socket, path: Path) -> bool:
    """Whether ``sock`` is a listening Unix stream socket bound to ``path``."""
    try:
        return (
            sock.family == socket.AF_UNIX
            and sock.type == socket.SOCK_STREAM
            and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
            and sock.getsockname() == str(path)
        )
    except OSError:
        return False


def _buffered(reader: asyncio.StreamReader | None) -> bool:
    """Whether ``reader`` holds bytes read from its socket and not yet taken. StreamReader has
    no public way to ask: without its ``_buffer`` (another Python), the answer is yes, which
    only costs the next daemon a read of the queue."""
    buffer = getattr(reader, "_buffer", None)
    return buffer is None or len(buffer) > 0


def _parse_store_name(name: str) -> tuple[str, AgentHello | None, bool] | None:
    """(sid, None, False) for a listener's name, (sid, hello, resync) for a connection's; None
    if not ours."""
    if not name.startswith(STORE_PREFIX):
        return None
    words = name[len(STORE_PREFIX) :].split(".")
    resync = len(words) in (4, 5) and words[-1] == RESYNC_SUFFIX
    if resync:
        words.pop()
    # Not there in an earlier version's names, nor for version 1: the agent's is 1.
    version = parse_version_word(words.pop()) if len(words) == 4 else 1
    try:
        sid = check_sid(words[0])
        if len(words) == 1:
            return sid, None, False
        if len(words) == 3 and words[1].isdigit() and words[2].isdigit() and version is not None:
            hello = AgentHello(pid=int(words[1]), uid=int(words[2]), protocol=version)
            return sid, hello, resync
    except IronclawError:
        pass
    return None


# The most digits each number of the box's lines may have: a pid or uid is a 32-bit number, a
# seq a 63-bit one. The pid and uid name the connection in the fd store (``_Kept.name``, at most
# 255 characters): a hello of 240 digits made a name systemd cannot take, and the hand-over of
# every session failed with it.
ID_DIGITS = 10
SEQ_DIGITS = 19


def _number(word: str, digits: int) -> bool:
    """Plain ASCII digits, at most ``digits`` of them (``int`` would also take a sign, '_' and
    surrounding space)."""
    return 0 < len(word) <= digits and word.isascii() and word.isdigit()


def _parse_hello(line: bytes) -> AgentHello:
    words = line.decode("ascii", "strict").split()
    # The protocol version comes last, from version 2 on; an agent that names none speaks 1.
    version = parse_version_word(words.pop()) if words and is_version_word(words[-1]) else 1
    if (
        version is None
        or len(words) not in (3, 4)
        or words[0] != "hello"
        or not all(_number(w, ID_DIGITS) for w in words[1:3])
        or (len(words) == 4 and not _number(words[3], SEQ_DIGITS))
    ):
        raise ValueError(
            f"expected 'hello <pid> <uid> [<outbound seq>] [v<protocol version>]' (pid and uid "
            f"of at most {ID_DIGITS} digits, seq of at most {SEQ_DIGITS}, version of at most "
            f"{VERSION_DIGITS}), got {line[:60]!r}"
        )
    outbound = int(words[3]) if len(words) == 4 else 0
    return AgentHello(pid=int(words[1]), uid=int(words[2]), outbound_seq=outbound,
                      protocol=version)  # fmt: skip


AGENT_EVENTS = frozenset({"outbound"})


def _parse_event(line: bytes) -> tuple[str, int]:
    words = line.decode("ascii", "strict").split()
    if len(words) != 2 or words[0] not in AGENT_EVENTS or not _number(words[1], SEQ_DIGITS):
        raise ValueError(f"expected 'outbound <seq>' (at most {SEQ_DIGITS} digits), "
                         f"got {line[:60]!r}")  # fmt: skip
    return words[0], int(words[1])


def peer_in_unit(sock: socket.socket, unit: str) -> bool:
    """Whether the connecting process is in ``unit``'s own cgroup (proc(5) /proc/<pid>/cgroup)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid = struct.unpack("3i", raw)[0]
    if pid <= 0:
        return False
    try:
        pid1 = Path("/proc/1/cgroup").read_text()
        text = Path(f"/proc/{pid}/cgroup").read_text()
        return in_unit_cgroup(text, pid1, unit)
    except (OSError, HostError, ValueError) as exc:  # ValueError: a path not UTF-8
        ratelog.warning(log, unit, "peer check failed", "checking a peer of %s (pid %d): %s",
                        unit, pid, exc)  # fmt: skip
        return False


def in_unit_cgroup(text: str, pid1_cgroup: str, unit: str) -> bool:
    """Whether a /proc/<pid>/cgroup text puts the process in ``unit``'s own cgroup, read in
    the hierarchy systemd tracks units in: the one :func:`systemd_root` takes from PID 1's
    (v1's ``name=systemd`` on a legacy or hybrid host, ``0::`` on a unified one). A line of
    any other hierarchy, a v1 controller's (``4:memory:/...``) or an unmanaged ``0::/`` on a
    legacy host, says nothing of the unit, neither for nor against."""
    key, pid1_path = _systemd_line(pid1_cgroup)
    root = posixpath.dirname(pid1_path).rstrip("/")
    for line in text.splitlines():
        parts = line.split(":", 2)  # a path may hold ":" itself
        if len(parts) == 3 and f"{parts[0]}:{parts[1]}" == key:
            return parts[2] == unit_cgroup(root, unit)
    return False


def _systemd_line(cgroup: str) -> tuple[str, str]:
    """The first line of a /proc/<pid>/cgroup text in a hierarchy systemd manages, as
    (``id:controllers``, path); HostError if there is none."""
    for line in cgroup.splitlines():
        hierarchy_id, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if (hierarchy_id == "0" and controllers == "") or controllers == "name=systemd":
            return f"{hierarchy_id}:{controllers}", path
    raise HostError("reading /proc/1/cgroup: no systemd hierarchy (is PID 1 systemd?)")


def systemd_root(pid1_cgroup: str) -> str:
    """The cgroup systemd manages, from PID 1's /proc/1/cgroup: the parent of its init.scope
    ("" on a host; a subtree when systemd runs in a container or the test harness)."""
    return posixpath.dirname(_systemd_line(pid1_cgroup)[1]).rstrip("/")


def unit_cgroup(root: str, unit: str) -> str:
    """Where systemd puts a sandbox unit: ``<root>/ironclaw.slice/<unit>`` (systemd.slice(5);
    ironclaw.slice is a top-level slice)."""
    return f"{root}/{paths.SLICE}/{unit}"
