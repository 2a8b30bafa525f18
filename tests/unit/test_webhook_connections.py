"""Any local user can reach a loopback webhook listener, and aiohttp held each connection (idle,
or with half its headers sent) for up to an hour: enough of them took the daemon's descriptors
and left admin.sock and the session sockets unable to accept (found by a review). A listener
now holds at most ``MAX_CONNECTIONS``, closing one past it at once, and closes a connection
that sent no whole request within ``IDLE_SECONDS``. Over a real loopback listener."""

from __future__ import annotations

import asyncio
import time

import pytest

from ironclawd.domain.channels import ChannelConfig, WebhookEndpoint
from ironclawd.host import webhook
from ironclawd.host.webhook import WebhookChannel
from tests.fakes import FakeClock


class _Sink:
    async def receive(self, *_: object) -> None:  # never reached: no request is completed
        raise AssertionError("no request should reach the sink")


async def _closed_by_server(reader: asyncio.StreamReader, within: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), within) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_connections_past_the_cap_are_closed_and_idle_ones_time_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(webhook, "MAX_CONNECTIONS", 8)
    monkeypatch.setattr(webhook, "IDLE_SECONDS", 1.0)

    async def go() -> None:
        clock = FakeClock()
        config = ChannelConfig("hooks", "webhook", listen="127.0.0.1:0",
                               endpoints=(WebhookEndpoint("a", "sec-a"),))  # fmt: skip
        channel = WebhookChannel(config, lambda _: "a" * 40, clock, None)  # type: ignore[arg-type]
        await channel.start(_Sink())  # type: ignore[arg-type]
        host, port = channel.bound.rsplit(":", 1)
        held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            for n in range(10):
                reader, writer = await asyncio.open_connection(host, int(port))
                if n % 2:  # half of them send half a request's headers, and stop
                    writer.write(b"POST /hooks/a HTTP/1.1\r\nHost: x\r\n")
                held.append((reader, writer))
            await asyncio.sleep(0.1)
            extra = [await _closed_by_server(r, 0.2) for r, _ in held[8:]]
            assert extra == [True, True]  # past the cap: closed at once
            started = time.monotonic()
            kept = [await _closed_by_server(r, 5.0) for r, _ in held[:8]]
            assert kept == [True] * 8  # idle or half-sent: closed after IDLE_SECONDS
            assert time.monotonic() - started < 4.0
            # Room again: a new connection is served (an unknown path gets its 404).
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert (await reader.read()).startswith(b"HTTP/1.1 404")
            writer.close()
        finally:
            for _, writer in held:
                writer.close()
            await channel.stop()

    asyncio.run(go())
