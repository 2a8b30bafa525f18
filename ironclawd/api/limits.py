"""Connection and call limits for a session's sockets (control, model, gateway, egress).

The box shares each socket among all its processes, so a limit that simply refuses the n+1th
connection lets a few idle connections lock the agent out of its own socket (issue 10: eight did
it on model.sock). Here a socket holds at most ``max_connections``; a new connection is always
admitted and, when the socket is full, the connection that has gone longest without use is
dropped, preferring one with no call in flight. The agent's channel reconnects on its next call;
a hoarder's connections are the ones that go. New connections and calls are also metered per
session (token buckets), so a looping box cannot keep the daemon's one event loop busy and slow
every other session. Calls are not alike (one may carry 4 MiB to parse and check), so each
session also has a share of the loop's time (:class:`Share`, ``[sockets] loop_share``): what
its calls' own steps on the loop took is charged to it (:class:`Charged`), and while that is
overdrawn its next calls wait.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# The HTTP/2 client connection preface (RFC 9113 §3.4): every gRPC connection starts with it.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class TokenBucket:
    """``rate`` events a second on average, bursts up to ``burst``."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic):
        self._rate, self._burst, self._clock = rate, burst, clock
        self._tokens = burst
        self._at = clock()

    def take(self) -> bool:
        """Spend one token if there is one; whether there was."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def wait_seconds(self) -> float:
        """How long from now until a token is there (0 if one is), if no one takes one."""
        now = self._clock()
        tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        return max(0.0, (1 - tokens) / self._rate)


class Share:
    """A share of some time: ``share`` seconds of it a second on average, at most ``burst``
    seconds saved up. What is spent is charged after the fact and may overdraw it: a call is
    let in while the share is not overdrawn and then pays what it took, however much."""

    def __init__(self, share: float, burst: float, clock: Callable[[], float] = time.monotonic):
        self._share, self._burst, self._clock = share, burst, clock
        self._balance = burst
        self._at = clock()

    def _refilled(self) -> float:
        now = self._clock()
        self._balance = min(self._burst, self._balance + (now - self._at) * self._share)
        self._at = now
        return self._balance

    def overdrawn(self) -> bool:
        return self._refilled() < 0

    def spend(self, seconds: float) -> None:
        self._refilled()
        self._balance -= seconds

    def wait_seconds(self) -> float:
        """How long from now until it is no longer overdrawn (0 if it is not)."""
        return max(0.0, -self._refilled() / self._share)


class Charged(Generic[T]):
    """Await ``awaitable`` (a coroutine, or an async generator's next item), charging the CPU
    time of the current thread that each of its steps took to ``charge``: a step is what runs
    between two suspensions, so this counts the awaited code's own work on the event loop and
    nothing of the other tasks that run while it waits."""

    def __init__(
        self,
        awaitable: Awaitable[T],
        charge: Callable[[float], None],
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self._awaitable, self._charge, self._cpu = awaitable, charge, cpu

    def __await__(self) -> Generator[Any, Any, T]:
        inner = self._awaitable.__await__()
        value: Any = None
        thrown: BaseException | None = None
        try:
            while True:
                started = self._cpu()
                try:
                    yielded = inner.send(value) if thrown is None else inner.throw(thrown)
                except StopIteration as finished:
                    return finished.value  # type: ignore[no-any-return]
                finally:
                    self._charge(self._cpu() - started)
                try:
                    value, thrown = (yield yielded), None
                except GeneratorExit:
                    raise
                except BaseException as exc:  # thrown in (a cancellation): passed on
                    value, thrown = None, exc
        finally:
            inner.close()


@dataclass(eq=False)
class Conn:
    """One admitted connection: when it was last used (opened, or a call began or ended) and
    how many calls it has in flight. Bytes alone do not count as use: a hoarder can trickle
    them, and the daemon's keepalive pings touch every connection alike."""

    close: Callable[[], None]
    clock: Callable[[], float] = time.monotonic
    used: float = field(default=0.0)
    calls: int = 0
    closed: bool = False

    def __post_init__(self) -> None:
        self.used = self.clock()

    def call_started(self) -> None:
        self.calls += 1
        self.used = self.clock()

    def call_ended(self) -> None:
        self.calls -= 1
        self.used = self.clock()


class ConnectionTable:
    """The connections open on one session socket, at most ``limit`` of them."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._open: list[Conn] = []

    def admit(self, conn: Conn) -> Conn | None:
        """Add ``conn``; if that makes one too many, close and return the one dropped for it:
        the least recently used idle connection, else the least recently used of all."""
        evicted = None
        if len(self._open) >= self._limit:
            idle = [c for c in self._open if c.calls == 0]
            evicted = min(idle or self._open, key=lambda c: c.used)
            self.remove(evicted)
            evicted.closed = True
            evicted.close()
        self._open.append(conn)
        return evicted

    def remove(self, conn: Conn) -> None:
        if conn in self._open:
            self._open.remove(conn)

    def close_all(self) -> None:
        for conn in list(self._open):
            self.remove(conn)
            conn.closed = True
            conn.close()

    def __len__(self) -> int:
        return len(self._open)
