"""The ports the inbox takes (services/inbox_sessions.py ``SessionPort``,
services/inbox_delivery.py ``MessagePort``): the fakes of tests/fakes/channels.py
(``FakeChannelSessions``, ``FakeMessages``) and the real ``SessionService`` and
``MessageService`` answer alike.

The real services run in-process over the host-effect fakes (tests/fakes), which pass their
own contracts in this directory against the real adapters: a session is created through the
whole lifecycle, a message goes into its (fake) inbound queue and is announced on its (fake)
control socket, and the agent's answer is a row in its outbound queue announced as the agent
announces it ("outbound <seq>"), then ingested and watched."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.messages import Reply
from ironclawd.domain.session import State
from ironclawd.errors import InvalidArgument, NotFound
from ironclawd.ports import SessionLookup
from ironclawd.services.inbox_delivery import MessagePort
from ironclawd.services.inbox_sessions import SessionPort
from ironclawd.services.messaging import MessageService
from ironclawd.services.session_hooks import SessionHooks
from ironclawd.services.session_lifecycle import SandboxLayout, SandboxLifecycle
from ironclawd.services.sessions import SessionService
from tests.fakes import (
    FakeBundles,
    FakeClock,
    FakeControl,
    FakeMounts,
    FakeNetns,
    FakeRuntime,
    FakeSessionData,
    FakeUnits,
    MemoryReplies,
    MemorySessions,
    RecordingAudit,
)
from tests.fakes.channels import FakeChannelSessions, FakeMessages
from tests.fakes.records import StaticSessions

pytestmark = pytest.mark.anyio
AGENT = "helper"
STATE_DIR = Path("/var/lib/ironclaw")
WAIT = 5.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Ports:
    sessions: SessionPort
    messages: MessagePort
    real: tuple[FakeSessionData, FakeControl, FakeClock] | None = None

    async def answer(self, sid: str, in_reply_to: int, body: str) -> None:
        """The session's agent answers: a row in its outbound queue, then its announcement."""
        if self.real is None:
            assert isinstance(self.messages, FakeMessages)
            await self.messages.reply(sid, in_reply_to, body)
            return
        data, control, clock = self.real
        rows = data.outbound_rows.setdefault(sid, [])
        rows.append((len(rows) + 1, in_reply_to, clock.time(), body.encode()))
        assert control.listener is not None
        await control.listener(sid, "outbound", len(rows))


def real_services(
    data: FakeSessionData | None = None,
) -> tuple[SessionService, MessageService, FakeSessionData, FakeControl, FakeClock]:
    """The real session and message services, over the host-effect fakes (``data`` if given)."""
    clock, control, hooks = FakeClock(), FakeControl(), SessionHooks()
    data = data if data is not None else FakeSessionData()
    audit = RecordingAudit()
    layout = SandboxLayout(bundles_dir=STATE_DIR / "bundles", rootfs=STATE_DIR / "rootfs" / "x",
                           start_timeout=WAIT, adopt_timeout=WAIT, unit_check_seconds=0.01,
                           idle_timeout=0.0, state_dir=STATE_DIR)  # fmt: skip
    lifecycle = SandboxLifecycle(
        units=FakeUnits(), netns=FakeNetns(), control=control, runtime=FakeRuntime(),
        layout=layout, data=data, mounts=FakeMounts(), bundles=FakeBundles(), sockets=hooks,
    )  # fmt: skip
    sessions = SessionService(store=MemorySessions(), lifecycle=lifecycle,
                              agents={AGENT: AgentSpec(AGENT)}, hooks=hooks, audit=audit,
                              clock=clock)  # fmt: skip
    messages = MessageService(store=MemoryReplies(), sessions=sessions, hooks=hooks, data=data,
                              control=control, agent_uid=10000, agent_gid=10000, audit=audit,
                              clock=clock)  # fmt: skip
    return sessions, messages, data, control, clock


@pytest.fixture(params=["fake", "real"])
async def ports(request: pytest.FixtureRequest) -> AsyncIterator[Ports]:
    if request.param == "fake":
        fake_sessions = FakeChannelSessions()
        yield Ports(fake_sessions, FakeMessages(fake_sessions))
        return
    sessions, messages, data, control, clock = real_services()
    try:
        yield Ports(sessions, messages, (data, control, clock))
    finally:
        await sessions.close()


async def replies(ports: Ports, sid: str, after: int) -> list[tuple[int, int, str]]:
    """What a watcher that does not follow sees after ``after``."""
    async with asyncio.timeout(WAIT):
        watched = ports.messages.watch(sid, after, False)
        return [(r.seq, r.in_reply_to, r.body) async for r in watched]


async def test_a_session_is_created_for_an_agent_and_found_by_its_id(ports: Ports) -> None:
    made = await ports.sessions.create(AGENT)
    assert (made.agent, made.state) == (AGENT, State.RUNNING)
    assert ports.sessions.get(made.sid).sid == made.sid
    named = await ports.sessions.create(AGENT, "givenid0001")
    assert named.sid == "givenid0001"
    with pytest.raises(NotFound, match="session unknownid0001 not found"):
        ports.sessions.get("unknownid0001")
    with pytest.raises(InvalidArgument, match="session id: expected 8-32 characters"):
        ports.sessions.get("../../etc")


async def test_a_service_without_a_warm_pool_shows_none(ports: Ports) -> None:
    assert ports.sessions.pool is None


async def test_messages_are_numbered_and_a_repeated_client_id_is_the_same_message(
    ports: Ports,
) -> None:
    sid = (await ports.sessions.create(AGENT)).sid
    first = await ports.messages.send(sid, "hello")
    second = await ports.messages.send(sid, "again", "ch-abc")
    repeat = await ports.messages.send(sid, "again, retried", "ch-abc")
    assert [(s.seq, s.new) for s in (first, second, repeat)] == [(1, True), (2, True), (2, False)]
    with pytest.raises(NotFound, match="session unknownid0001 not found"):
        await ports.messages.send("unknownid0001", "hello")


@pytest.mark.parametrize(
    ("body", "client_id", "problem"),
    [("   ", "", "expected some text"), ("bell\x07", "", "message"),
     ("fine", "has space", "client id")],
)  # fmt: skip
async def test_a_message_the_queue_refuses_is_named_and_not_queued(
    ports: Ports, body: str, client_id: str, problem: str
) -> None:
    sid = (await ports.sessions.create(AGENT)).sid
    with pytest.raises(InvalidArgument, match=problem):
        await ports.messages.send(sid, body, client_id)
    assert (await ports.messages.send(sid, "the first one queued")).seq == 1


async def test_the_agents_answers_are_watched_in_order_after_a_point(ports: Ports) -> None:
    sid = (await ports.sessions.create(AGENT)).sid
    assert await replies(ports, sid, 0) == []
    await ports.messages.send(sid, "one")
    await ports.messages.send(sid, "two")
    await ports.answer(sid, 1, "answer one")
    await ports.answer(sid, 2, "answer two")
    assert await replies(ports, sid, 0) == [(1, 1, "answer one"), (2, 2, "answer two")]
    assert await replies(ports, sid, 1) == [(2, 2, "answer two")]


async def test_a_follower_gets_an_answer_that_comes_later(ports: Ports) -> None:
    sid = (await ports.sessions.create(AGENT)).sid
    await ports.messages.send(sid, "one")

    async def first() -> Reply:
        async for reply in ports.messages.watch(sid, 0, True):
            return reply
        raise AssertionError("the watch ended")

    follower = asyncio.ensure_future(first())
    await asyncio.sleep(0.05)
    assert not follower.done()
    await ports.answer(sid, 1, "late")
    reply = await asyncio.wait_for(follower, WAIT)
    assert (reply.seq, reply.in_reply_to, reply.body) == (1, 1, "late")


@pytest.mark.parametrize("impl", ["fake", "real"])
async def test_the_sandbox_apis_lookup_finds_a_running_session_and_refuses_others(
    impl: str,
) -> None:
    """``SessionLookup`` (the sandbox APIs' question: whose session is this call from?): the
    fake ``StaticSessions`` over a fixed table, the real ``SessionService``."""
    lookup: SessionLookup
    if impl == "fake":
        sid = "fixedsid0001"
        lookup = StaticSessions(**{sid: AGENT})
        sessions = None
    else:
        sessions = real_services()[0]
        sid = (await sessions.create(AGENT)).sid
        lookup = sessions
    try:
        found = lookup.get(sid)
        assert (found.sid, found.agent, found.state) == (sid, AGENT, State.RUNNING)
        with pytest.raises(NotFound, match="session unknownid0001 not found"):
            lookup.get("unknownid0001")
        with pytest.raises(InvalidArgument, match="session id: expected 8-32 characters"):
            lookup.get("s1")
    finally:
        if sessions is not None:
            await sessions.close()
