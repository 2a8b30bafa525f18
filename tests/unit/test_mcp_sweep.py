"""The MCP supervisor's start-up sweep (services/mcp_servers.py ``sweep``): the units an earlier
run left are stopped in the background, so the daemon's READY does not wait for D-Bus, and no
server of this run starts before the sweep is over (it would otherwise stop it). The launcher is
the contract-tested fake (tests/fakes/mcp.py ``LocalLauncher``) with its calls recorded in order
and its ``stop_all`` held until the test releases it; the server has no command, so the fake
refuses it without starting a process. tests/integration/test_daemon.py proves the sweep on the
real daemon and units."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest

from ironclawd.domain.mcp import McpLimits, McpServer
from ironclawd.errors import HostError, McpServerFailed
from ironclawd.ports.mcp import McpTransport
from ironclawd.services.mcp_servers import McpSupervisor
from tests.fakes.mcp import LocalLauncher

SERVER = McpServer("tool")  # no command: LocalLauncher refuses it at once
LIMITS = McpLimits(connect_timeout_seconds=5.0)
REFUSED = "MCP server tool has no command to run"


class OrderedLauncher(LocalLauncher):
    """``LocalLauncher`` recording ``stop_all``, ``open`` and ``stop`` in order; ``stop_all``
    waits until ``release`` is set (then fails if ``sweep_fails``)."""

    def __init__(self, *, sweep_fails: bool = False) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.release = asyncio.Event()
        self.sweep_fails = sweep_fails

    async def stop_all(self) -> None:
        self.calls.append("stop_all begins")
        await self.release.wait()
        self.calls.append("stop_all ends")
        if self.sweep_fails:
            raise HostError("listing units ironclaw-mcp-*.service: D-Bus said no")
        await super().stop_all()

    @contextlib.asynccontextmanager
    async def open(self, agent: str, server: McpServer) -> AsyncIterator[McpTransport]:
        self.calls.append(f"open {agent}/{server.name}")
        async with super().open(agent, server) as transport:
            yield transport

    async def stop(self, agent: str, server: str) -> None:
        self.calls.append(f"stop {agent}/{server}")
        await super().stop(agent, server)


async def _first_use_during_the_sweep(launcher: OrderedLauncher) -> McpSupervisor:
    clients = McpSupervisor(launcher, LIMITS)
    clients.sweep()
    use = asyncio.create_task(clients.list_tools("agent1", SERVER))
    for _ in range(20):  # the sweep and the use both run as far as they can
        await asyncio.sleep(0)
    assert launcher.calls == ["stop_all begins"], "a server started before the sweep ended"
    launcher.release.set()
    with pytest.raises(McpServerFailed, match=REFUSED):
        await use
    return clients


def test_no_server_starts_before_the_sweep_of_leftovers_is_over() -> None:
    async def go() -> list[str]:
        launcher = OrderedLauncher()
        clients = await _first_use_during_the_sweep(launcher)
        clients.sweep()  # a second call does not sweep again
        await clients.close()
        return launcher.calls

    calls = asyncio.run(go())
    assert calls[:3] == ["stop_all begins", "stop_all ends", "open agent1/tool"]
    # close() at the daemon's stop (the failed server is not running): every unit once more
    assert calls[3:] == ["stop_all begins", "stop_all ends"]


def test_a_failed_sweep_is_logged_and_servers_still_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def go() -> list[str]:
        launcher = OrderedLauncher(sweep_fails=True)
        await _first_use_during_the_sweep(launcher)
        return launcher.calls

    with caplog.at_level(logging.ERROR, logger="ironclawd.mcp"):
        calls = asyncio.run(go())
    assert calls[:3] == ["stop_all begins", "stop_all ends", "open agent1/tool"]
    assert "left behind: listing units ironclaw-mcp-*.service: D-Bus said no" in caplog.text


def test_a_caller_that_gives_up_waiting_does_not_cancel_the_sweep() -> None:
    async def go() -> list[str]:
        launcher = OrderedLauncher()
        clients = McpSupervisor(launcher, LIMITS)
        clients.sweep()
        use = asyncio.create_task(clients.list_tools("agent1", SERVER))
        await asyncio.sleep(0)
        use.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await use
        launcher.release.set()
        await clients._swept()
        return launcher.calls

    assert asyncio.run(go()) == ["stop_all begins", "stop_all ends"]


def test_a_stop_after_a_clean_sweep_and_no_server_stops_nothing() -> None:
    # Nothing of this run was started and the earlier run's units are gone: close() makes no
    # D-Bus call (the daemon's stop, issue 17). Without a sweep, close() stops every unit.
    async def go(sweep: bool) -> list[str]:
        launcher = OrderedLauncher()
        launcher.release.set()
        clients = McpSupervisor(launcher, LIMITS)
        if sweep:
            clients.sweep()
            await clients._swept()
        await clients.close()
        return launcher.calls

    assert asyncio.run(go(sweep=True)) == ["stop_all begins", "stop_all ends"]
    assert asyncio.run(go(sweep=False)) == ["stop_all begins", "stop_all ends"]
