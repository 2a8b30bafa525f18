"""``Daemon._hand_over`` at a clean stop: a hand-over that fails is reported and the stop goes
on (the audit log's queued records, the state DB and the master key are closed after it); the
agents then reconnect as after a crash."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any, cast

import pytest

from ironclawd import daemon
from ironclawd.api.control import ControlServer
from ironclawd.host.fdstore import SystemdFdStore


class Control:
    def __init__(self, handed: list[tuple[str, list[int]]] | Exception) -> None:
        self._handed = handed

    async def hand_over(self) -> list[tuple[str, list[int]]]:
        if isinstance(self._handed, Exception):
            raise self._handed
        return self._handed


class Store:
    def __init__(self, put: bool | Exception = True) -> None:
        self._put = put
        self.entries: list[tuple[str, list[int]]] = []

    def put_all(self, entries: list[tuple[str, list[int]]]) -> bool:
        if isinstance(self._put, Exception):
            raise self._put
        self.entries = entries
        return self._put

    def barrier(self, timeout: float) -> bool:
        return True


def _hand_over(control: Control, store: Store) -> None:
    asyncio.run(daemon.Daemon._hand_over(cast(ControlServer, control), cast(SystemdFdStore, store)))


@pytest.mark.parametrize(
    ("control", "store"),
    [
        (Control(KeyError("a connection that ended")), Store()),
        (Control([("x" * 300, [0])]), Store(ValueError("fd store name: expected 1-255 ..."))),
        (Control([("control.keep0001", [0])]), Store(OSError(9, "Bad file descriptor"))),
    ],
)
def test_a_failed_hand_over_is_reported_and_the_stop_goes_on(
    control: Control, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="ironclawd"):
        _hand_over(control, store)  # returns: the caller goes on closing
    assert "handing the control sockets to the fd store failed" in caplog.text
    assert "agents reconnect after the restart" in caplog.text


def test_what_the_store_takes_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    a, b = socket.socketpair()
    handed: list[tuple[str, list[int]]] = [("control.keep0001", [a.fileno()])]
    store = Store()
    with caplog.at_level(logging.INFO, logger="ironclawd"):
        _hand_over(Control(handed), store)
    assert store.entries == handed
    assert "handed 1 control socket(s) to the fd store" in caplog.text
    a.close()
    b.close()


def test_a_store_that_refuses_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    entries: Any = [("control.keep0001", [0])]
    with caplog.at_level(logging.WARNING, logger="ironclawd"):
        _hand_over(Control(entries), Store(put=False))
    assert "the fd store did not take the 1 control socket(s)" in caplog.text
