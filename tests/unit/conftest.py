"""The unit tier is pure: no subprocesses, no namespaces, no D-Bus. A test that tries one fails
loudly here instead of quietly touching the host."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


class HostEffectForbidden(AssertionError):
    pass


def _forbid(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise HostEffectForbidden(f"unit tests may not {what}; move this to tests/integration")

    return refuse


@pytest.fixture(autouse=True)
def _no_host_effects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess.Popen, "__init__", _forbid("start a subprocess"))
    monkeypatch.setattr(os, "system", _forbid("run a shell command"))
    for name in ("unshare", "setns", "fork", "chown", "mount"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _forbid(f"call os.{name}"))


@pytest.fixture
def notify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A Unix datagram socket standing in for systemd's notification socket ($NOTIFY_SOCKET)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    sock.bind(str(path))
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield sock
    sock.close()
