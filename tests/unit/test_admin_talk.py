"""An agent's permissions may name the host users and groups who talk to it (``user:``,
``group:``). Only ``SendMessage`` applied them: another admin member could not send to the
agent but could read every reply it gave (``WatchReplies``, what ``ironctl chat`` and ``send``
print) and admit a held stranger's message to it, which then talked to the agent on that
member's word (found by a review, stop 48; closed stop 50). All three refuse now, the same
way; a caller named in the permissions, or any member where none is named, goes through."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.api import auth
from ironclawd.api.admin import AdminServicer
from ironclawd.api.admin_channels import ChannelsMixin
from ironclawd.api.peer import Caller
from ironclawd.errors import NotFound, PolicyDenied
from ironclawd.ports.channels import Admission
from tests.fakes import RecordingAudit
from tests.unit.test_inbox import ROOM, World, agent

NO_GROUP = 4242424  # a gid without a name: the callers below are in no named group
ALLOWED = Caller(1001, NO_GROUP, 10, (), "alice", True)
OTHER = Caller(1002, NO_GROUP, 11, (), "mallory", True)


def restricted(spec: Any) -> Any:
    """``spec`` whose permissions name host user alice (and its channel sender, as before)."""
    allow = (*spec.permissions.allow, "user:alice")
    return replace(spec, permissions=replace(spec.permissions, allow=allow))


class Replies:
    """A message service whose one session has one reply."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send(self, sid: str, text: str, client_id: str, sender: str) -> Any:
        self.sent.append(text)
        return SimpleNamespace(seq=1, new=True, replies_before=0)

    async def watch(self, sid: str, after: int, follow: bool) -> Any:
        yield SimpleNamespace(seq=1, in_reply_to=1, created_at=0.0, body="the secret plan",
                              chain=b"\0" * 32)  # fmt: skip


def servicer(spec: Any) -> Any:
    """Just what SendMessage and WatchReplies read of an AdminServicer."""
    session = SimpleNamespace(agent=spec.name)
    return SimpleNamespace(
        _sessions=SimpleNamespace(get=lambda sid: session),
        _registry={spec.name: spec},
        _messages=Replies(),
    )


def watch(svc: Any, caller: Caller) -> list[str]:
    async def go() -> list[str]:
        auth._CALLER.set(caller)
        request = admin_pb2.WatchRepliesRequest(sid="s1", after_seq=0, follow=False)
        return [r.reply.text async for r in AdminServicer.WatchReplies(svc, request, None)]  # type: ignore[arg-type]

    return asyncio.run(go())


def send(svc: Any, caller: Caller) -> None:
    async def go() -> None:
        auth._CALLER.set(caller)
        request = admin_pb2.SendMessageRequest(sid="s1", text="hi", client_id="c1")
        await AdminServicer.SendMessage(svc, request, None)  # type: ignore[arg-type]

    asyncio.run(go())


def test_a_member_the_permissions_do_not_name_cannot_read_the_agents_replies() -> None:
    svc = servicer(restricted(agent()))
    with pytest.raises(PolicyDenied, match=r"uid 1002 \(mallory\) may not talk to agent 'helper'"):
        watch(svc, OTHER)
    assert watch(svc, ALLOWED) == ["the secret plan"]


def test_sending_is_refused_the_same_way() -> None:
    svc = servicer(restricted(agent()))
    with pytest.raises(PolicyDenied, match="may not talk to agent 'helper'"):
        send(svc, OTHER)
    assert svc._messages.sent == []
    send(svc, ALLOWED)
    assert svc._messages.sent == ["hi"]


def test_permissions_naming_no_host_user_let_every_member_read() -> None:
    svc = servicer(agent())  # only a channel sender is named
    assert watch(svc, OTHER) == ["the secret plan"]


class Channels(ChannelsMixin):
    def __init__(self, w: World) -> None:
        self._inbox = w.inbox
        self._audit_trail = RecordingAudit()  # type: ignore[assignment]
        self._messages = SimpleNamespace(note_sender=lambda sid, who: None)  # type: ignore[assignment]


def held_stranger(w: World) -> int:
    async def go() -> int:
        await w.inbox.start()
        await w.adapter.inject("do it", sender="@eve:test", where=ROOM, event_id="$9")
        assert w.adapter.last_receipt.admission is Admission.HELD
        (held,) = w.inbox.held()
        return held.id

    return asyncio.run(go())


def admit(w: World, caller: Caller, held_id: int) -> admin_pb2.AdmitHeldResponse:
    async def go() -> admin_pb2.AdmitHeldResponse:
        auth._CALLER.set(caller)
        try:
            return await Channels(w).AdmitHeld(admin_pb2.AdmitHeldRequest(id=str(held_id)), None)  # type: ignore[arg-type]
        finally:
            await w.inbox.stop()

    return asyncio.run(go())


def test_a_member_the_permissions_do_not_name_cannot_admit_a_held_message_to_the_agent() -> None:
    w = World(restricted(agent(unknown="hold")))
    held_id = held_stranger(w)
    with pytest.raises(PolicyDenied, match="may not talk to agent 'helper'"):
        admit(w, OTHER, held_id)
    assert w.queued() == []
    assert [h.id for h in w.inbox.held()] == [held_id], "a refused admission lost the message"
    assert admit(w, ALLOWED, held_id).admission == "queued"
    assert w.queued() == ["do it"]


def test_without_host_users_named_any_member_admits() -> None:
    w = World(agent(unknown="hold"))
    held_id = held_stranger(w)
    assert admit(w, OTHER, held_id).admission == "queued"


def test_the_held_message_of_a_route_gone_is_still_not_found() -> None:
    w = World(restricted(agent(unknown="hold")))
    held_id = held_stranger(w)
    w.agents.clear()
    with pytest.raises(NotFound, match="nothing is wired"):
        admit(w, OTHER, held_id)


def listed(w: World, caller: Caller, **request: Any) -> admin_pb2.ListHeldResponse:
    async def go() -> admin_pb2.ListHeldResponse:
        auth._CALLER.set(caller)
        return await Channels(w).ListHeld(admin_pb2.ListHeldRequest(**request), None)  # type: ignore[arg-type]

    return asyncio.run(go())


def test_held_messages_are_listed_only_to_whoever_may_talk_to_their_agent() -> None:
    """ListHeld showed every held text to every member (found by the review of this stop's
    diff): a message held for an agent whose permissions name other users is theirs alone."""
    restricted_agent = restricted(agent(unknown="hold"))
    open_agent = replace(agent("open", unknown="hold"), wiring=(
        replace(restricted_agent.wiring[0], where="!open:test"),))  # fmt: skip
    w = World(restricted_agent, open_agent)

    async def hold() -> None:
        await w.inbox.start()
        for n, where in enumerate((ROOM, "!open:test", ROOM, "!open:test")):
            await w.adapter.inject(f"m{n}", sender="@eve:test", where=where, event_id=f"${n}")
        await w.inbox.stop()

    asyncio.run(hold())
    assert [h.text for h in listed(w, ALLOWED).held] == ["m0", "m1", "m2", "m3"]
    assert [h.text for h in listed(w, OTHER).held] == ["m1", "m3"]
    # Paged, skipped rows still move the page on: every visible message once.
    seen, after = [], 0
    while True:
        page = listed(w, OTHER, after_id=after, limit=1)
        seen += [h.text for h in page.held]
        after = page.next_after_id
        if not after:
            break
    assert seen == ["m1", "m3"]
