"""What a box writes on its control socket is read at its session's call rate (ironclawd/api/
control.py, ``[sockets] calls_per_second``): every line it writes ("outbound <seq>", or one the
daemon cannot parse) made the daemon act at once, and a read of the socket (up to 256 KiB, some
43,000 short lines) was all acted on before the event loop took another turn. A box flooding it
held the loop for a second at a time with lines it could not parse, and for over half its time
with "outbound 1" (found by a review). Its further lines now wait in the socket."""

from __future__ import annotations

import asyncio
import contextlib
import time

from ironclawd.api import control
from tests.unit.test_control_limits import LIMITS, Box, in_unit, run

__all__ = ["in_unit"]  # the fixture, used by name below

READ_SECONDS = 0.5
# What the session may have acted on in READ_SECONDS: its saved-up lines, then the rate.
MOST = 2 * LIMITS.calls_per_second + LIMITS.calls_per_second * READ_SECONDS + 5


async def _flood(box: Box, line: bytes) -> tuple[list[int], float]:
    """The events the daemon acted on while the agent wrote ``line`` over and over for
    READ_SECONDS, and the longest the event loop went without a turn meanwhile."""
    acted: list[int] = []

    async def listener(sid: str, event: str, value: int) -> None:
        acted.append(value)

    box.server.set_listener(listener)
    agent = await box.connect(b"hello 7 10000\n")
    writing = asyncio.create_task(asyncio.get_running_loop().sock_sendall(agent, line * 200_000))
    lag, started = 0.0, time.monotonic()
    while time.monotonic() - started < READ_SECONDS:
        before = time.monotonic()
        await asyncio.sleep(0.005)
        lag = max(lag, time.monotonic() - before - 0.005)
    writing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await writing
    return acted, lag


def test_announcements_are_acted_on_at_the_sessions_call_rate(in_unit: None) -> None:
    async def body(box: Box) -> None:
        acted, lag = await _flood(box, b"outbound 1\n")
        assert 0 < len(acted) <= MOST
        assert lag < 0.1
        assert not box.channel.disconnected.is_set()  # paced, not dropped

    asyncio.run(run(body))


def test_lines_it_cannot_parse_cost_no_more_and_the_loop_goes_on(in_unit: None) -> None:
    async def body(box: Box) -> None:
        acted, lag = await _flood(box, b"bogus\n")
        assert acted == []
        assert lag < 0.1
        assert control.MAX_LINE == 256

    asyncio.run(run(body))
