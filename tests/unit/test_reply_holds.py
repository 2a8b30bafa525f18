"""A session held at one of its bounds (services/ingest_holds.py): its ingestion takes no more,
what it did not take stays in the box's queue, the refusal is logged at a bounded rate and
audited once per episode, the operator sees why and what to do in the session's error, and a
reload that raises the bound takes the rest. Other sessions are not affected. The real services
over real SQLCipher files (reply_world.py)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd import daemon
from ironclawd.api.admin import AdminServicer
from ironclawd.config import parse_config
from ironclawd.domain.message_ids import MessageId
from ironclawd.domain.messages import QueueLimits
from ironclawd.domain.reply_bounds import ReplyUsage, nearing
from ironclawd.ports import RESYNC
from tests.unit.reply_world import AGENT, World, world

SID, OTHER = "h3ld5e55i0n1", "0th3r5e55i0n"
KIB = 1024


def admin(w: World) -> Any:
    """The admin API over the world's services (what its session calls read)."""
    return AdminServicer(doctor=None, sessions=w.sessions, messages=w.messages, journal=None,  # type: ignore[arg-type]
                         gateway=None, registry=None, audit=None, mcp=None, inbox=None,  # type: ignore[arg-type]
                         config_source="test", started=0.0)  # fmt: skip


def held_records(w: World) -> list[dict[str, object]]:
    return [fields for event, _actor, fields in w.audit.records if event == "outbound.held"]


def test_a_held_session_is_audited_once_logged_at_a_bounded_rate_and_shows_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ironclawd.messages")

    async def go() -> None:
        w = world(tmp_path, QueueLimits(max_replies_per_message=2))
        for sid in (SID, OTHER):
            await w.sessions.create(AGENT, sid)
            await w.messages.send(sid, "hello")
        await w.write(SID, [(1, "one"), (1, "two"), (1, "three")])
        for n in range(40):  # the box writes on and announces, over and over
            await w.write(SID, [(1, f"more {n}")])
        assert [seq for seq, *_ in await w.replies(SID)] == [1, 2]
        assert set(range(3, 44)) <= set(w.left_in_box(SID))  # nothing dropped
        # Audited once for the episode (before: "outbound.refused" for each, 20 a minute).
        reason = "reply 3 would be reply 3 to message 1, over [queues] max_replies_per_message (2)"
        assert held_records(w) == [{"sid": SID, "reply_seq": 3, "reason": reason}]
        why = w.messages.held(SID)
        assert why.startswith("replies held in its outbound queue from seq 3: reply 3 would be")
        assert why.endswith(
            "raise [queues] max_replies_per_message and run systemctl reload "
            f"ironclawd, or remove the session (ironctl session rm --force {SID})"
        )
        svc = admin(w)
        shown = await svc.GetSession(admin_pb2.GetSessionRequest(sid=SID), None)
        assert shown.session.error == why
        listed = {
            s.sid: s.error
            for s in (await svc.ListSessions(admin_pb2.ListSessionsRequest(), None)).sessions
        }
        assert listed == {SID: why, OTHER: ""}
        # Another session is served as before.
        await w.write(OTHER, [(1, "yes")])
        assert await w.replies(OTHER) == [(1, 1, "yes")]
        await w.sessions.remove(SID, force=True)  # the way out: nothing of the hold stays
        assert w.messages.held(SID) == ""
        await w.sessions.close()
        w.store.close()

    asyncio.run(go())
    lines = [r for r in caplog.records if SID in r.getMessage() and "held" in r.getMessage()]
    assert 1 < len(lines) <= 12, len(lines)  # the episode's line, then at most 10 a minute
    assert lines[0].MESSAGE_ID == "e0d1630d73b241cb975107678b71fb2e"  # type: ignore[attr-defined]


def test_a_reload_that_raises_the_bound_takes_the_held_replies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(daemon, "set_level", lambda level: None)
    running = parse_config("[queues]\nmax_ingested_bytes = 1048576\n", "a.toml")
    raised = parse_config("[queues]\nmax_ingested_bytes = 67108864\n", "b.toml")

    async def go() -> None:
        w = world(tmp_path, running.queues)
        await w.sessions.create(AGENT, SID)
        for n in range(1, 21):
            await w.messages.send(SID, f"message {n}")
        await w.write(SID, [(n, "z" * (100 * KIB)) for n in range(1, 21)])
        taken = len(await w.replies(SID))
        assert taken < 20
        assert "max_ingested_bytes" in w.messages.held(SID)
        d = daemon.Daemon(Path("a.toml"), running)
        d._messages = w.messages
        d._apply(raised)  # systemctl reload ironclawd
        assert d._config.queues == raised.queues  # applied, not waiting for a restart
        for _ in range(100):
            if len(await w.replies(SID)) == 20:
                break
            await asyncio.sleep(0.02)
        assert len(await w.replies(SID)) == 20
        assert w.messages.held(SID) == ""
        assert len(held_records(w)) == 1
        await w.sessions.close()
        w.store.close()

    asyncio.run(go())


def test_a_bound_raised_across_a_restart_takes_the_held_replies_at_the_next_start(
    tmp_path: Path,
) -> None:
    """The agent announced its held replies once. A clean restart hands its connection over
    marked to be read in full (api/control.py), so the next daemon, with the bound raised in
    its configuration, takes them at once, not at the session's next message."""
    running = parse_config("[queues]\nmax_ingested_bytes = 1048576\n", "a.toml")
    raised = parse_config("[queues]\nmax_ingested_bytes = 67108864\n", "b.toml")

    async def go() -> None:
        w = world(tmp_path, running.queues)
        await w.sessions.create(AGENT, SID)
        await w.sessions.create(AGENT, OTHER)
        for n in range(1, 21):
            await w.messages.send(SID, f"message {n}")
        await w.messages.send(OTHER, "hello")
        await w.write(SID, [(n, "z" * (100 * KIB)) for n in range(1, 21)])
        await w.write(OTHER, [(1, "yes")])
        assert len(await w.replies(SID)) < 20
        # What the daemon's control sockets ask at a clean stop (ControlServer.hand_over).
        assert w.control.unsettled is not None
        assert (w.control.unsettled(SID), w.control.unsettled(OTHER)) == (True, False)
        after = world(tmp_path, raised.queues, store=w.store)  # the next daemon
        assert after.control.listener is not None
        await after.control.listener(SID, RESYNC, 0)  # its restored connection, marked
        assert len(await after.replies(SID)) == 20
        assert after.control.unsettled is not None
        assert not after.control.unsettled(SID)
        await w.sessions.close()
        w.store.close()

    asyncio.run(go())


def test_a_session_with_max_rows_replies_is_held_only_when_it_writes_another(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        w = world(tmp_path, QueueLimits(max_rows=3))
        await w.sessions.create(AGENT, SID)
        for n in range(1, 6):
            await w.messages.send(SID, f"message {n}")
        await w.write(SID, [(n, f"answer {n}") for n in range(1, 4)])
        assert len(await w.replies(SID)) == 3
        assert await w.messages.ingest(SID) == 0
        assert (w.messages.held(SID), held_records(w)) == ("", [])  # before: refused each time
        await w.write(SID, [(4, "answer 4")])
        assert len(await w.replies(SID)) == 3
        assert "reply 4 would be over [queues] max_rows (3)" in w.messages.held(SID)
        larger = replace(QueueLimits(), max_rows=10)
        w.messages.configure(larger)
        for _ in range(100):
            if len(await w.replies(SID)) == 4:
                break
            await asyncio.sleep(0.02)
        assert len(await w.replies(SID)) == 4
        await w.sessions.close()
        w.store.close()

    asyncio.run(go())


def near_records(w: World) -> list[dict[str, object]]:
    return [fields for event, _actor, fields in w.audit.records if event == "outbound.near_bound"]


def test_a_session_nearing_a_lifetime_bound_is_said_once_before_it_is_held(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """max_rows and max_ingested_bytes count over a session's whole life, so an honest
    long-lived session reaches them too (found by a review): the operator hears of it at 80%,
    once, with its own message id, while its replies are still taken."""
    caplog.set_level(logging.INFO, logger="ironclawd.messages")

    async def go() -> None:
        w = world(tmp_path, QueueLimits(max_rows=10))
        await w.sessions.create(AGENT, SID)
        for n in range(1, 12):
            await w.messages.send(SID, f"q{n}")
            await w.write(SID, [(n, f"a{n}")])
        assert [seq for seq, *_ in await w.replies(SID)] == list(range(1, 11))  # then held
        reason = "its replies have reached 8 of [queues] max_rows (10)"
        assert near_records(w) == [{"sid": SID, "reason": reason}]
        near = [r for r in caplog.records
                if getattr(r, "MESSAGE_ID", "") == MessageId.REPLIES_NEAR_BOUND.value]  # fmt: skip
        assert [r.getMessage() for r in near] == [
            f"session {SID}: {reason}; ingestion holds at the bound (nothing is lost): before "
            f"then, raise [queues] max_rows and run systemctl reload ironclawd, or remove the "
            f"session (ironctl session rm --force {SID})"
        ]
        assert held_records(w)  # and at the bound, held as before
        await w.sessions.close()
        w.store.close()

    asyncio.run(go())


def test_nearing_says_which_bound_once_per_crossing() -> None:
    limits = QueueLimits(max_rows=100, max_ingested_bytes=1000)
    assert nearing(ReplyUsage(700), ReplyUsage(800), (1, 2), limits) == (
        "its replies have reached 800 of [queues] max_ingested_bytes (1000)"
    )
    assert nearing(ReplyUsage(800), ReplyUsage(900), (2, 3), limits) == ""  # said already
    assert nearing(ReplyUsage(0), ReplyUsage(1), (79, 80), limits) == (
        "its replies have reached 80 of [queues] max_rows (100)"
    )
    assert nearing(ReplyUsage(0), ReplyUsage(1), (80, 81), limits) == ""
