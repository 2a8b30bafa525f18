"""What the daemon tells systemd (sd_notify) and how it reads the watchdog interval systemd asks
for, against a real notification socket standing in for systemd's ($NOTIFY_SOCKET, a Unix
datagram socket). The real systemd is the integration tier's (test_daemon.py: READY and the
status line; a daemon that stopped pinging would be killed there after WatchdogSec)."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from ironclawd import daemon
from ironclawd.daemon import _notify, watchdog_usec


def test_states_go_out_as_one_message_of_assignments(notify: socket.socket) -> None:
    _notify(ready=1, status="serving admin API on /run/ironclaw/admin.sock")
    assert notify.recv(4096).decode() == (
        "READY=1\nSTATUS=serving admin API on /run/ironclaw/admin.sock"
    )
    _notify(stopping=1, status="stopping")
    assert notify.recv(4096).decode() == "STOPPING=1\nSTATUS=stopping"


@pytest.mark.parametrize(
    ("environ", "usec"),
    [
        ({}, 0),  # no watchdog asked for
        ({"WATCHDOG_USEC": "30000000"}, 30_000_000),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}, 30_000_000),  # ours
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, 0),  # another process's
        ({"WATCHDOG_USEC": "thirty"}, 0),
        ({"WATCHDOG_USEC": "-5"}, 0),
        ({"WATCHDOG_USEC": ""}, 0),
    ],
)
def test_the_watchdog_interval_is_read_as_sd_watchdog_enabled_does(
    environ: dict[str, str], usec: int
) -> None:
    assert watchdog_usec(environ, pid=4242) == usec


def test_the_watchdog_is_pinged_from_the_event_loop_at_half_the_interval(
    notify: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "20000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    notify.setblocking(False)

    async def ping_a_while() -> list[str]:
        task = asyncio.create_task(daemon.Daemon._watchdog())
        got: list[str] = []
        loop = asyncio.get_running_loop()
        while len(got) < 3:
            got.append((await asyncio.wait_for(loop.sock_recv(notify, 4096), 5)).decode())
        task.cancel()
        return got

    assert asyncio.run(ping_a_while()) == ["WATCHDOG=1"] * 3


def test_no_watchdog_asked_for_means_no_pings(
    notify: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    asyncio.run(daemon.Daemon._watchdog())  # returns at once
    notify.setblocking(False)
    with pytest.raises(BlockingIOError):
        notify.recv(4096)
