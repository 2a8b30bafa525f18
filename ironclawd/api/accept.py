"""Accepting on a session's sockets at the session's connection rate (``[sockets]
connections_per_second`` a socket, twice that saved up).

Each socket took every connection as it came and refused one over the rate only once it had been
accepted, given a transport and a task, and its peer checked through /proc; control.sock had no
connection rate at all. A box that connected and closed in a loop made ~4,800 connections a
second on model.sock, all refused, for ~60% of the daemon's event loop, and ~4,400 a second on
control.sock for 68% (found by a review). Here a listener is watched only while its rate takes
another connection: once it does not, the listener's reader is removed until the rate allows one
again, and new connects wait in the kernel's backlog (128; past it a blocking connect waits for
room and a non-blocking one fails with EAGAIN). A box's churn costs the loop about its rate in
accepts a second, and other sessions nothing: each socket of each session has its own rate.

Only a connection from the session's own unit spends the rate. Anyone else (a host user may
connect: the sockets are 0666, docs/threat-model.md A4) is refused on the bare socket as soon as
it is accepted, before any transport or task, and spends nothing, so that it cannot keep the
session's agent waiting behind it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

from ironclawd import ratelog
from ironclawd.api.limits import TokenBucket
from ironclawd.config import SocketsConfig

log = logging.getLogger("ironclawd.accept")

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Admit = Callable[[socket.socket], bool]

# Connections accepted in one turn of the loop at most (asyncio's own server takes up to 100):
# a run of refused outsiders lets other work in between.
ACCEPT_BATCH = 32
# An accept that fails (out of descriptors or memory): the listener rests this long, as
# asyncio's own server does.
EXHAUSTED_PAUSE = 1.0


class PacedServer:
    """Serves ``sock`` (listening, non-blocking): each connection ``admit`` takes is handed to
    ``handler`` as a stream pair in a task of its own, at most as ``rate`` allows; one that
    ``admit`` refuses (it logs why) is closed at once and costs no token. ``sid`` and ``name``
    (the socket's file name) name it in the journal."""

    def __init__(
        self, sock: socket.socket, handler: Handler, rate: TokenBucket, admit: Admit, *,
        sid: str, name: str, limit: int,
    ) -> None:  # fmt: skip
        self._loop = asyncio.get_running_loop()
        sock.setblocking(False)  # one the fd store gave back too: an accept must never wait
        self._sock: socket.socket | None = sock
        self._handler, self._rate, self._admit = handler, rate, admit
        self._sid, self._name, self._limit = sid, name, limit
        self._watching = False
        self._resume: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # the loop keeps only weak references
        self._watch()

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        """The listening socket while served (the fd store takes it at a hand-over)."""
        return () if self._sock is None else (self._sock,)

    def paced(self) -> bool:
        """Whether the listener is resting for the rate (or for want of descriptors) now."""
        return self._sock is not None and not self._watching

    def close(self) -> None:
        """Stop serving and close the listener. Its connections are their handlers' to end (as
        with asyncio's own server in Python 3.11)."""
        if self._sock is None:
            return
        self._unwatch()
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        self._sock.close()
        self._sock = None

    async def wait_closed(self) -> None:
        """Nothing to wait for: ``close`` is done once it returns."""

    def _watch(self) -> None:
        self._resume = None
        if self._sock is not None and not self._watching:
            self._loop.add_reader(self._sock.fileno(), self._readable)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching and self._sock is not None:
            self._loop.remove_reader(self._sock.fileno())
        self._watching = False

    def _rest(self, seconds: float) -> None:
        self._unwatch()
        self._resume = self._loop.call_later(seconds, self._watch)

    def _readable(self) -> None:
        for _ in range(ACCEPT_BATCH):
            if self._sock is None:
                return
            wait = self._rate.wait_seconds()
            if wait > 0:
                ratelog.info(log, self._sid, f"{self._name} paced",
                             "session %s: %s over its new connections a second: the next wait "
                             "in its backlog", self._sid, self._name)  # fmt: skip
                self._rest(wait)
                return
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                # Out of descriptors or memory, most likely (any other error would recur at
                # once): the connects wait in the backlog meanwhile.
                ratelog.error(log, self._sid, f"{self._name} accept",
                              "session %s: accepting on %s: %s: resting %g s", self._sid,
                              self._name, exc, EXHAUSTED_PAUSE)  # fmt: skip
                self._rest(EXHAUSTED_PAUSE)
                return
            try:
                admitted = self._admit(conn)
            except Exception as exc:  # a check that failed refuses, and never logs per connect
                ratelog.error(log, self._sid, f"{self._name} admit",
                              "session %s: checking a connection on %s: %r", self._sid,
                              self._name, exc)  # fmt: skip
                admitted = False
            if not admitted:
                conn.close()
                continue
            self._rate.take()
            task = self._loop.create_task(self._serve(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket) -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(sock=conn, limit=self._limit)
        except OSError:
            conn.close()
            return
        try:
            await self._handler(reader, writer)
        except asyncio.CancelledError:
            # The loop is stopping: this connection ends with it. Not re-raised: Python 3.11
            # logs a traceback for every connection task that ends cancelled.
            writer.transport.abort()
        except Exception:
            log.exception("session %s: serving a %s connection", self._sid, self._name)
            writer.transport.abort()


def serve_paced(
    handler: Handler, sock: socket.socket, limits: SocketsConfig, admit: Admit, *,
    sid: str, name: str, limit: int = 2**16,
) -> PacedServer:  # fmt: skip
    """Serve a session's socket at ``limits.connections_per_second`` (twice that saved up)."""
    rate = limits.connections_per_second
    return PacedServer(sock, handler, TokenBucket(rate, 2 * rate), admit, sid=sid, name=name,
                       limit=limit)  # fmt: skip
