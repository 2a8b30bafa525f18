"""Whether the caller may talk to the agent (its permissions' host users and groups) was checked
once, when ``WatchReplies`` began. A follow stream (``ironctl chat``, ``send --follow``) opened
while the caller was allowed went on after an approved permissions change took them out: the
change restarts the agent's sessions, not the streams on them, and the member read every
later reply. Each reply is now checked against the agent's permissions as they are then."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.api import auth
from ironclawd.api.admin import AdminServicer
from ironclawd.errors import PolicyDenied
from tests.unit.test_admin_talk import OTHER, restricted
from tests.unit.test_inbox import agent


class Followed:
    """A session's replies as a follow stream: the second comes once ``more`` is set."""

    def __init__(self) -> None:
        self.more = asyncio.Event()

    async def watch(self, sid: str, after: int, follow: bool) -> Any:
        for seq, body in ((1, "before"), (2, "after the change")):
            if seq == 2:
                await self.more.wait()
            yield SimpleNamespace(seq=seq, in_reply_to=seq, created_at=0.0, body=body,
                                  chain=b"\0" * 32)  # fmt: skip


def test_a_follow_stream_ends_once_a_change_takes_the_caller_out_of_the_permissions() -> None:
    spec = agent()  # names no host user: every member may talk to it
    registry = {spec.name: spec}
    followed = Followed()
    svc = SimpleNamespace(
        _sessions=SimpleNamespace(get=lambda sid: SimpleNamespace(agent=spec.name)),
        _registry=registry,
        _messages=followed,
    )
    read: list[str] = []

    async def go() -> None:
        auth._CALLER.set(OTHER)
        request = admin_pb2.WatchRepliesRequest(sid="s1", after_seq=0, follow=True)
        stream = AdminServicer.WatchReplies(svc, request, None)  # type: ignore[arg-type]
        read.append((await anext(stream)).reply.text)
        registry[spec.name] = restricted(spec)  # approved: only user alice talks to it now
        followed.more.set()
        with pytest.raises(PolicyDenied, match=r"uid 1002 \(mallory\) may not talk"):
            read.append((await anext(stream)).reply.text)

    asyncio.run(go())
    assert read == ["before"]
