"""Replies going back out (services/inbox_delivery.py) when the daemon's own bookkeeping fails:
a session's replies are delivered once the cause is gone, without waiting for another channel
message or a restart (tests/unit/test_inbox.py has the world these run in)."""

from __future__ import annotations

from typing import Any

import pytest

from ironclawd.errors import DiskFull
from tests.unit.test_inbox import ALICE, ROOM, World, run


def fail_once(obj: object, name: str, exc: Exception) -> None:
    """The next call of ``obj.name`` raises ``exc``; the ones after it work."""
    real = getattr(obj, name)
    left = [exc]

    def failing(*args: Any, **kwargs: Any) -> Any:
        if left:
            raise left.pop()
        return real(*args, **kwargs)

    setattr(obj, name, failing)


def shown(w: World) -> list[str]:
    return [r.text for r in w.adapter.shown.values()]


@pytest.mark.parametrize("step", ["add_delivery", "save_delivery"])
def test_a_full_state_db_while_delivering_backs_off_and_delivers(
    step: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def test(w: World) -> None:
        await w.adapter.inject("q", sender=ALICE, where=ROOM, event_id="$1")
        sid = w.adapter.last_receipt.sid
        fail_once(w.records, step, DiskFull("adding a delivery: database or disk is full"))
        await w.messages.reply(sid, 1, "a")  # no other message comes for the session
        await w.inbox.deliverer.idle(sid, 1)
        assert shown(w) == ["a"]
        assert w.records.deliveries[(sid, 1)].state == "delivered"
        assert w.sleeps == [1.0]  # the back-off, then the watch again from reply 1
        await w.messages.reply(sid, 1, "b")
        await w.inbox.deliverer.idle(sid, 2)
        assert shown(w) == ["a", "b"]

    run(test)
    assert "database or disk is full; again in 1s" in caplog.text
