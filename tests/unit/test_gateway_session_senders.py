"""Four-eyes compared the approver with the submitter only. A session does what the people
talking to it ask (the mock model even runs "/tool request_change {...}"), so a member could
have a session submit the egress rule she may not approve as her own, then approve it alone
(found by a review). Now the host users who had sent the session messages are kept with the
change, and under four-eyes none of them may approve it."""

from __future__ import annotations

import asyncio

import pytest

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.changes import ChangeState
from ironclawd.errors import Conflict
from ironclawd.host.mounts import HostMounts
from ironclawd.services.gateway import Gateway, GatewayPolicy
from ironclawd.services.messaging import MessageService
from ironclawd.services.registry import Registry
from ironclawd.services.session_hooks import SessionHooks
from tests.contract.test_inbox_ports import AGENT, real_services
from tests.fakes import FakeClock, MemoryAgents, MemoryChanges, RecordingAudit

ALICE, BOB = "uid:1000(alice)", "uid:1001(bob)"
SID = "a2u5k8gguri5"
EGRESS = '{"rules":[{"host":"evil.example","methods":["POST"]}]}'


def _gateway(senders: dict[str, frozenset[str]]) -> tuple[Gateway, RecordingAudit]:
    clock = FakeClock(1000.0)
    audit = RecordingAudit()

    async def restart(agent: str) -> list[str]:
        return []

    gateway = Gateway(
        store=MemoryChanges(), registry=Registry(MemoryAgents(), [AgentSpec("demo")], clock),
        audit=audit, policy=GatewayPolicy(four_eyes=frozenset({"egress"})),
        restart_agent_sessions=restart, mounts=HostMounts(), clock=clock,
        drivers=lambda sid: senders.get(sid, frozenset()),
    )  # fmt: skip
    return gateway, audit


def test_no_one_who_talked_to_the_submitting_session_approves_under_four_eyes() -> None:
    gateway, audit = _gateway({SID: frozenset({ALICE})})
    change = gateway.submit("egress", "demo", EGRESS, "", f"session:{SID}", only_agent="demo")
    assert change.drivers == (ALICE,)
    assert audit.records[-1][2]["session_senders"] == [ALICE]
    with pytest.raises(Conflict, match=rf"four-eyes: .*alice.* sent messages to session:{SID}"):
        asyncio.run(gateway.approve(change.id, change.hash, "uid:1000(alice-renamed)"))
    assert asyncio.run(gateway.approve(change.id, change.hash, BOB)).state is ChangeState.APPLIED


def test_without_four_eyes_for_the_kind_a_sender_may_approve() -> None:
    gateway, _ = _gateway({SID: frozenset({ALICE})})
    change = gateway.submit("persona", "demo", '{"persona": "Hi."}', "", f"session:{SID}",
                            only_agent="demo")  # fmt: skip
    assert asyncio.run(gateway.approve(change.id, change.hash, ALICE)).state is (
        ChangeState.APPLIED
    )


def test_the_message_service_remembers_who_sent_a_session_messages_for_its_life() -> None:
    async def go() -> None:
        sessions, messages, data, control, clock = real_services()
        await sessions.create(AGENT, SID)
        await messages.send(SID, "hello")  # a channel's message: no host user
        assert messages.senders(SID) == frozenset()
        await messages.send(SID, "please ask for egress", sender=ALICE)
        await messages.send(SID, "again", sender=ALICE)
        assert messages.senders(SID) == {ALICE}
        messages.note_sender(SID, BOB)  # bob admitted a held channel message into it
        assert messages.senders(SID) == {ALICE, BOB}
        # A restart adopts the session, its queue and what was asked of it: a new service over
        # the same records still knows who asked (in memory only, it forgot: found by a review).
        again = MessageService(store=messages.store, sessions=sessions, hooks=SessionHooks(),
                               data=data, control=control, agent_uid=10000, agent_gid=10000,
                               audit=RecordingAudit(), clock=clock)  # fmt: skip
        assert again.senders(SID) == {ALICE, BOB}
        # (A removal destroys them with the session's data: contract/test_records.py.)
        await sessions.close()

    asyncio.run(go())
