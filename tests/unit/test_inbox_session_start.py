"""A channel message whose session cannot start (services/inbox.py ``_session_for``): the
channel offers it again after each error (a webhook sender retries its 503, Matrix syncs the
batch again), and each try made one more FAILED session, each with a key and queue
directories, for as long as the cause lasted. The session is recorded for its route's key
before it is made, so the tries after the first start that one again."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.session import Session, State
from ironclawd.errors import HostError, IronclawError, SandboxError
from ironclawd.ports import AgentHello
from ironclawd.services.inbox import Inbox
from tests.contract.test_inbox_ports import AGENT, real_services
from tests.fakes import FakeClock
from tests.fakes.channels import (
    FakeChannelAdapter,
    FakeChannelSessions,
    FakeMessages,
    MemoryChannelRecords,
)
from tests.unit.test_inbox import ALICE, ROOM, agent

TRIES = 5


async def offer_again(adapter: FakeChannelAdapter, tries: int) -> None:
    """The channel offering the same event after each error, ``tries`` times."""
    for _ in range(tries):
        try:
            await adapter.inject("hello", sender=ALICE, where=ROOM, event_id="$1")
        except IronclawError:
            continue


def test_a_session_that_cannot_start_is_made_once_and_started_again() -> None:
    async def go() -> tuple[list[Session], list[str]]:
        sessions, messages, _data, _control, _clock = real_services()
        starts: list[str] = []

        async def bring_up(session: Session, spec: AgentSpec) -> AgentHello:
            starts.append(session.sid)
            raise HostError("mount source /srv/share: refused: holds a socket")

        sessions.lifecycle.bring_up = bring_up  # type: ignore[method-assign, assignment]
        adapter = FakeChannelAdapter("chat", "matrix")
        inbox = Inbox(records=MemoryChannelRecords(), messages=messages, sessions=sessions,
                      agents={AGENT: agent(AGENT)}, adapters={"chat": adapter},
                      clock=FakeClock())  # fmt: skip
        await inbox.start()
        try:
            await offer_again(adapter, TRIES)
        finally:
            await inbox.stop()
            made = sessions.list_sessions()
            await sessions.close()
        return made, starts

    made, starts = asyncio.run(go())
    assert [s.state for s in made] == [State.FAILED]
    assert starts == [made[0].sid] * TRIES  # each try started the one session again


class _PooledStartFails(FakeChannelSessions):
    """A service whose pool holds a sandbox of the agent, and whose starts all fail (the
    session is stored FAILED first, as ``SessionService`` does)."""

    def __init__(self) -> None:
        super().__init__()
        self.creates: list[str | None] = []
        self.pool = self  # type: ignore[assignment]

    def status(self) -> list[tuple[str, int]]:
        return [(AGENT, 1)]

    async def create(self, agent: str, sid: str | None = None) -> Session:
        self.creates.append(sid)
        made = await super().create(agent, sid)
        self.sessions[made.sid] = replace(made, state=State.FAILED)
        raise SandboxError(f"starting session {made.sid}: runsc: exit status 128")


def test_a_pooled_create_that_fails_is_followed_by_one_recorded_first() -> None:
    """A pooled sandbox is taken only by a create that lets the service pick the id (the
    inbox cannot know it when the start fails): the next try names its session first."""

    async def go() -> tuple[_PooledStartFails, MemoryChannelRecords]:
        sessions = _PooledStartFails()
        records = MemoryChannelRecords()
        adapter = FakeChannelAdapter("chat", "matrix")
        inbox = Inbox(records=records, messages=FakeMessages(sessions), sessions=sessions,
                      agents={AGENT: agent(AGENT)}, adapters={"chat": adapter},
                      clock=FakeClock())  # fmt: skip
        await inbox.start()
        try:
            await offer_again(adapter, TRIES)
        finally:
            await inbox.stop()
        return sessions, records

    sessions, records = asyncio.run(go())
    first, named = sessions.creates
    assert first is None  # the pool's
    assert named is not None
    assert records.channel_session("chat", ROOM, f"chat:{ALICE}") == named
    assert len(sessions.sessions) == 2
