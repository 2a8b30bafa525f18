"""The webhook channel tests' configuration, and a network namespace of the test's own for the
outbound ones.

``run_in_netns`` runs a coroutine on a fresh event loop in a thread that has unshared its network
namespace (unshare(2) with CLONE_NEWNET changes only the calling thread): it has ``lo`` and a
veth link carrying the addresses asked for, every socket made in the thread lives there, and
nothing of it is named or left behind once the thread ends. The host's interfaces are untouched.
``Recorder`` is an HTTP server recording what reaches it.
"""

from __future__ import annotations

import asyncio
import ctypes
import subprocess
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

from ironclawd.domain.channels import ChannelConfig, WebhookEndpoint
from ironclawd.errors import NotFound

T = TypeVar("T")
SECRETS = {"hook-secret-a": "a" * 40, "hook-secret-b": "b" * 40}
CONFIG = ChannelConfig(
    name="hooks",
    type="webhook",
    listen="127.0.0.1:0",
    endpoints=(WebhookEndpoint("github", "hook-secret-a"), WebhookEndpoint("ci", "hook-secret-b")),
    replay_window_seconds=300.0,
    max_message_bytes=1024,
    sender_messages_per_minute=1000,
    channel_messages_per_minute=1000,
)


def secret(name: str) -> str:
    """Like ``CredentialStore.get``: NotFound for a credential that is not there."""
    if name not in SECRETS:
        raise NotFound(f"credential {name}: not found")
    return SECRETS[name]


CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def run_in_netns(addresses: Sequence[str], main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``main()`` run in a new netns where ``addresses`` (CIDR) sit on a link ``d0``."""
    outcome: list[Any] = []

    def thread() -> None:
        try:
            if _libc.unshare(CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
            # Children forked from this thread start in its namespace.
            # No dummy driver on this kernel: a veth pair with both ends inside stands in.
            commands = [["ip", "link", "set", "lo", "up"],
                        ["ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1"],
                        *(["ip", "addr", "add", a, "dev", "d0"] for a in addresses),
                        ["ip", "link", "set", "d0", "up"],
                        ["ip", "link", "set", "d1", "up"]]  # fmt: skip
            for command in commands:
                subprocess.run(command, check=True, capture_output=True, timeout=30)
            outcome.append(asyncio.run(main()))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=thread, name="webhook-netns")
    worker.start()
    worker.join(120)
    if worker.is_alive():
        raise TimeoutError("the netns scenario did not end within 120 s")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]  # type: ignore[no-any-return]


@dataclass
class Seen:
    listener: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Recorder:
    """HTTP listeners that record every request; ``/status/<n>`` answers ``n``, else 200."""

    seen: list[Seen] = field(default_factory=list)
    runners: list[web.AppRunner] = field(default_factory=list)

    async def listen(self, host: str, port: int) -> None:
        async def handle(request: web.Request) -> web.Response:
            body = await request.read()
            self.seen.append(Seen(f"{host}:{port}", request.path, dict(request.headers), body))
            status = int(request.path.split("/")[2]) if request.path.startswith("/status/") else 200
            return web.Response(status=status, text="recorded")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        self.runners.append(runner)

    async def close(self) -> None:
        for runner in self.runners:
            await runner.cleanup()
