"""A box's GetChange on ``gateway.sock`` (ironclawd/api/sandbox_gateway.py) reads the state DB,
whose one lock a batch of another session's replies holds while it is written (~150 ms for the
8 MiB a batch may hold, measured on this machine's disk). The read ran on the event loop, so a
box calling GetChange 50 times a second while replies were being written held the loop for as
long as the writes held the lock (found by a review): the CPU-time share of the loop (api/limits
``Share``) does not count a wait for a lock. The read now runs in a thread of the gateway's own,
one at a time per session."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from ironclaw.gateway.v1 import gateway_pb2
from ironclawd.api.sandbox_gateway import GatewayServicer
from ironclawd.domain.changes import Change, ChangeState
from ironclawd.errors import RateLimited

HELD_SECONDS = 0.3


class _LockedGateway:
    """``get`` waits for the state DB's lock, which a writer holds for HELD_SECONDS."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def get(self, change_id: str) -> Change:
        with self.lock:
            return Change(id=change_id, kind="persona", agent="demo", payload="{}", reason="",
                          submitter="session:s1", before="", after="", hash="h",
                          created_at=0.0, expires_at=1.0, state=ChangeState.PENDING)  # fmt: skip


class _Sessions:
    def get(self, sid: str) -> Any:
        raise AssertionError("not asked")


def test_a_change_status_read_waits_for_the_state_db_off_the_event_loop() -> None:
    gateway = _LockedGateway()
    servicer = GatewayServicer(gateway, _Sessions(), lambda: "s1")  # type: ignore[arg-type]
    request = gateway_pb2.GetChangeRequest(id="chg-1")

    async def main() -> None:
        gateway.lock.acquire()  # another session's batch of replies is being written
        threading.Timer(HELD_SECONDS, gateway.lock.release).start()
        reading = asyncio.create_task(servicer.GetChange(request, None))  # type: ignore[arg-type]
        lag, started = 0.0, time.monotonic()
        while not reading.done():
            before = time.monotonic()
            await asyncio.sleep(0.01)
            lag = max(lag, time.monotonic() - before - 0.01)
        assert time.monotonic() - started >= HELD_SECONDS * 0.5  # it did wait for the lock
        assert lag < HELD_SECONDS / 2  # the loop went on meanwhile
        assert (await reading).change.state == "pending"
        # While a read of the session's waits, its next is refused: a looping box holds at most
        # one of the gateway's threads, whatever it sends. Once it is done, the next is taken.
        gateway.lock.acquire()
        reading = asyncio.create_task(servicer.GetChange(request, None))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        with pytest.raises(RateLimited, match="one change status at a time"):
            await servicer.GetChange(request, None)  # type: ignore[arg-type]
        gateway.lock.release()
        await reading
        assert (await servicer.GetChange(request, None)).change.id == "chg-1"  # type: ignore[arg-type]

    asyncio.run(asyncio.wait_for(main(), 10))
