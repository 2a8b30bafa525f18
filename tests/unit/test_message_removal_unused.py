"""``RemoveSession`` with ``only_if_unused``: ``ironctl chat --agent`` removes the session it
started if nothing was said in it, and read the session's activity before a forced removal: a
send from someone else that was queued between the read and the removal was destroyed with
the session although its sender was told it was queued (commit 73bdf3e said so). The daemon
judges it now, with sends held back: an append under way when the removal looks is waited for
and counted, one that comes after is refused if the session goes and let through if it
stays. Each race here is run step by step, on events."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.api.admin import AdminServicer
from ironclawd.api.boundary import refuse
from ironclawd.domain.session import State
from ironclawd.errors import Conflict, NotFound
from ironclawd.services.append_fence import AppendFence
from tests.contract.test_inbox_ports import AGENT, real_services
from tests.fakes import FakeSessionData

WAIT = 5.0


class GatedQueue:
    """A session's inbound queue whose appends, or reads of its last seq, wait at a gate once
    armed (``entered`` says one is waiting)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.armed: str = ""  # "append" or "last_seq"
        self.gate, self.entered = threading.Event(), threading.Event()

    def _held(self, what: str) -> None:
        if self.armed == what:
            self.entered.set()
            assert self.gate.wait(WAIT)

    def append(self, body: str, created_at: float, client_id: str | None) -> tuple[int, bool]:
        self._held("append")
        return self.inner.append(body, created_at, client_id)  # type: ignore[no-any-return]

    def last_seq(self) -> int:
        self._held("last_seq")
        return self.inner.last_seq()  # type: ignore[no-any-return]

    def close(self) -> None:
        self.inner.close()


class GatedData(FakeSessionData):
    def __init__(self) -> None:
        super().__init__()
        self.queues: dict[str, GatedQueue] = {}

    def inbound(self, sid: str, gid: int) -> Any:
        inner = super().inbound(sid, gid)
        queue = self.queues.get(sid)
        if queue is None or queue.inner is not inner:
            queue = self.queues[sid] = GatedQueue(inner)
        return queue


async def _waited(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, WAIT)


def _fence_up(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once a removal's fence is up, as its thread begins to look."""
    up, looking = threading.Event(), AppendFence._settled_then

    def marked(self: AppendFence, sid: str, read: Any) -> int:
        up.set()
        return looking(self, sid, read)

    monkeypatch.setattr(AppendFence, "_settled_then", marked)
    return up


def test_a_send_under_way_when_a_removal_if_unused_looks_is_kept_with_its_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race chat's removal lost: the send's append is under way (its thread holds it) as the
    removal looks at the queue. It is waited for, counted, and the session stays."""
    up = _fence_up(monkeypatch)

    async def go() -> tuple[int, list[str], State, int]:
        data = GatedData()
        sessions, messages, *_ = real_services(data)
        await sessions.create(AGENT, "unusedrace001")
        data.inbound("unusedrace001", 0).armed = "append"
        sending = asyncio.ensure_future(messages.send("unusedrace001", "from someone else"))
        await _waited(data.queues["unusedrace001"].entered)  # appending, not appended yet
        removing = asyncio.ensure_future(
            sessions.remove("unusedrace001", force=True, only_if_unused=True)
        )
        await _waited(up)
        data.queues["unusedrace001"].gate.set()
        sent = await asyncio.wait_for(sending, WAIT)
        with pytest.raises(Conflict, match="unusedrace001 has had messages queued to it"):
            await asyncio.wait_for(removing, WAIT)
        rows = [row[0] for row in data.inbound_queues["unusedrace001"].rows]
        state = sessions.get("unusedrace001").state
        after = await messages.send("unusedrace001", "and the next one")  # the fence is down
        await sessions.close()
        return sent.seq, rows, state, after.seq

    seq, rows, state, after = asyncio.run(go())
    assert seq == 1
    assert rows == ["from someone else"]  # before: destroyed with the session, told queued
    assert state is State.RUNNING  # left as it was: not even stopped
    assert after == 2


def test_a_send_that_comes_while_the_removal_looks_waits_and_goes_through_if_kept() -> None:
    """A kept session refuses nothing: a send that reaches its append while the look is under
    way waits for the verdict instead of being told the session is being removed."""

    async def go() -> tuple[int, list[str]]:
        data = GatedData()
        sessions, messages, *_ = real_services(data)
        await sessions.create(AGENT, "unusedkept001")
        await messages.send("unusedkept001", "the first")
        queue = data.queues["unusedkept001"]
        queue.armed = "last_seq"
        removing = asyncio.ensure_future(
            sessions.remove("unusedkept001", force=True, only_if_unused=True)
        )
        await _waited(queue.entered)  # the removal looks: its fence is up
        sending = asyncio.ensure_future(messages.send("unusedkept001", "the second"))
        await asyncio.sleep(0)  # the send reaches the fence and waits on the loop
        assert not sending.done()
        queue.gate.set()
        with pytest.raises(Conflict, match="has had messages queued to it: not removed"):
            await asyncio.wait_for(removing, WAIT)
        sent = await asyncio.wait_for(sending, WAIT)
        rows = [row[0] for row in data.inbound_queues["unusedkept001"].rows]
        await sessions.close()
        return sent.seq, rows

    assert asyncio.run(go()) == (2, ["the first", "the second"])


def test_a_session_never_sent_to_is_removed_and_a_send_meanwhile_is_refused_not_queued() -> None:
    async def go() -> tuple[list[str], dict[str, Any]]:
        data = GatedData()
        sessions, messages, *_ = real_services(data)
        await sessions.create(AGENT, "unusedgone001")
        queue = data.inbound("unusedgone001", 0)
        queue.armed = "last_seq"
        removing = asyncio.ensure_future(
            sessions.remove("unusedgone001", force=True, only_if_unused=True)
        )
        await _waited(queue.entered)
        sending = asyncio.ensure_future(messages.send("unusedgone001", "too late"))
        await asyncio.sleep(0)
        queue.gate.set()
        await asyncio.wait_for(removing, WAIT)
        with pytest.raises(NotFound, match="unusedgone001"):
            await asyncio.wait_for(sending, WAIT)
        ids = [s.sid for s in sessions.list_sessions()]
        await sessions.close()
        return ids, dict(data.inbound_queues)

    ids, queues = asyncio.run(go())
    assert ids == []
    assert "unusedgone001" not in queues


def test_the_admin_api_passes_only_if_unused_and_a_refusal_is_failed_precondition() -> None:
    class Aborted(Exception):
        pass

    class Context:
        code: grpc.StatusCode | None = None

        async def abort(self, code: grpc.StatusCode, details: str) -> None:
            self.code = code
            raise Aborted(details)

    async def go() -> tuple[grpc.StatusCode | None, str, list[str]]:
        sessions, messages, *_ = real_services()
        await sessions.create(AGENT, "unusedapi0001")
        await sessions.create(AGENT, "unusedapi0002")
        await messages.send("unusedapi0001", "hello")
        servicer: Any = SimpleNamespace(_sessions=sessions)
        request = admin_pb2.RemoveSessionRequest(sid="unusedapi0001", force=True,
                                                 only_if_unused=True)  # fmt: skip
        context = Context()
        with pytest.raises(Conflict) as refused:
            await AdminServicer.RemoveSession(servicer, request, None)  # type: ignore[arg-type]
        with pytest.raises(Aborted) as aborted:
            await refuse(refused.value, "RemoveSession", context)  # type: ignore[arg-type]
        request = admin_pb2.RemoveSessionRequest(sid="unusedapi0002", force=True,
                                                 only_if_unused=True)  # fmt: skip
        await AdminServicer.RemoveSession(servicer, request, None)  # type: ignore[arg-type]
        left = [s.sid for s in sessions.list_sessions()]
        await sessions.close()
        return context.code, str(aborted.value), left

    code, details, left = asyncio.run(go())
    assert code is grpc.StatusCode.FAILED_PRECONDITION
    assert details == "session unusedapi0001 has had messages queued to it: not removed"
    assert left == ["unusedapi0001"]


@pytest.mark.parametrize("used", [True, False])
def test_an_append_that_meets_the_fence_while_the_look_decides_waits_for_its_verdict(
    used: bool,
) -> None:
    """A send that passed ``passable`` just before a conditional removal put its fence up met
    the fence in its worker thread and was refused "being removed", though the look then kept
    the session (a review of this stop's diff). Now it waits for the verdict: let through if
    the session stays, refused if it goes."""
    fence = AppendFence()
    reading, answer = threading.Event(), threading.Event()
    outcome: list[str] = []

    def last_seq() -> int:
        reading.set()
        assert answer.wait(5)
        return 1 if used else 0

    def append() -> None:
        try:
            with fence.appending("s1"):
                outcome.append("appended")
        except NotFound:
            outcome.append("refused")

    async def go() -> bool:
        look = asyncio.ensure_future(fence.unused("s1", last_seq))
        assert await asyncio.to_thread(reading.wait, 5)  # the fence is up, the look reads
        worker = threading.Thread(target=append)
        worker.start()
        await asyncio.sleep(0.05)
        assert outcome == []  # neither refused nor appended: waiting for the verdict
        answer.set()
        kept = not await look
        await asyncio.to_thread(worker.join, 5)
        return kept

    kept = asyncio.run(go())
    assert kept is used
    assert outcome == (["appended"] if used else ["refused"])
