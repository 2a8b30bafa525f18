"""Small helpers the integration tiers share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import pytest

from ironclawd.domain.session import unit_name

if TYPE_CHECKING:
    from tests.harness.private_systemd import SystemdHarness

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T], done: Callable[[T], bool], timeout: float) -> T:
    """Poll ``probe`` until ``done`` holds (bounded); fail naming the last value seen. For
    conditions with no event to wait on (a unit's state seen through systemctl, say)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if done(value):
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:g}s; last seen: {value!r}")
        time.sleep(0.1)


def netns_of(sid: str) -> str:
    """A shell word naming a running session's netns: its sandbox unit's main process (runsc's
    parent) holds it; the session keeps no name under /run/netns once its unit runs."""
    return f"/proc/$(systemctl show -P MainPID {unit_name(sid)})/ns/net"


def session_netns(sysd: SystemdHarness, sid: str) -> str:
    """The path of a running session's netns (``netns_of``, resolved now, from Python)."""
    unit = unit_name(sid)
    proc = sysd.run(["systemctl", "show", "-P", "MainPID", unit])
    shown = (proc.stdout or b"").decode(errors="replace").strip()
    pid = int(shown or 0) if proc.returncode == 0 else 0
    assert pid > 0, f"{unit} has no main process: {shown!r} {proc.stderr!r}"
    return f"/proc/{pid}/ns/net"


def in_netns(sid: str, command: str) -> str:
    """runsc's control socket of a sandbox is an abstract Unix socket, which belongs to a
    network namespace: ``runsc ps/exec`` must run in the session's netns to reach it."""
    return f"nsenter --net={netns_of(sid)} {command}"
