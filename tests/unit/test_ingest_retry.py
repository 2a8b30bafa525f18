"""An agent announces each outbound commit once ("outbound <seq>", agent/loop.py), so every
failure to take its replies is tried again, not only a full state DB: a copy on a full /run, an
EIO from the state DB (found by a review: the reply waited for the agent's next write or a
restart)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
from typing import Any

import pytest

from ironclawd.errors import DiskFull, HostError
from ironclawd.services import messaging
from tests.contract.test_inbox_ports import AGENT, real_services
from tests.fakes import RecordingAudit

SID = "a2u5k8gguri5"


async def _announce(control: Any, sid: str, seq: int) -> None:
    """As api/control.py ControlServer._announce: a listener error is logged, not raised."""
    with contextlib.suppress(Exception):
        await control.listener(sid, "outbound", seq)


def _scenario(monkeypatch: pytest.MonkeyPatch, fail: str) -> list[int]:
    monkeypatch.setattr(messaging, "INGEST_RETRY_SECONDS", 0.01)

    async def go() -> list[int]:
        sessions, messages, data, control, clock = real_services()
        await sessions.create(AGENT, SID)
        await messages.send(SID, "hello")
        failures = {"left": 1}

        if fail in ("copy-enospc", "eio-read"):
            real_outbound = data.outbound

            def outbound(sid: str, uid: int) -> Any:
                reader = real_outbound(sid, uid)
                real_read = reader.read_after

                def read_after(*a: Any) -> Any:
                    if failures["left"]:
                        failures["left"] -= 1
                        code = errno.ENOSPC if fail == "copy-enospc" else errno.EIO
                        # what OutboundReader._refresh raises for an OSError of the copy
                        raise HostError(f"reading .../outbound.db: {OSError(code, 'x')}")
                    return real_read(*a)

                reader.read_after = read_after  # type: ignore[method-assign,assignment]
                return reader

            data.outbound = outbound  # type: ignore[method-assign]
        else:
            store = messages.store
            real_add = store.add_replies

            def add_replies(sid: str, replies: Any, usage: Any = None) -> None:
                if failures["left"]:
                    failures["left"] -= 1
                    if fail == "db-diskfull":
                        raise DiskFull("adding replies: database or disk is full")
                    raise HostError("adding replies of session in state DB: disk I/O error")
                real_add(sid, replies, usage)

            store.add_replies = add_replies  # type: ignore[method-assign]

        # The agent answers message 1 and announces it, once.
        data.outbound_rows.setdefault(SID, []).append((1, 1, clock.time(), b"the answer"))
        await _announce(control, SID, 1)
        await asyncio.sleep(0.5)  # 50 retry periods; the failure was one-off
        got = [r.seq async for r in messages.watch(SID, 0, False)]
        await sessions.close()
        return got

    return asyncio.run(go())


def test_control_a_full_state_db_is_retried_until_it_takes_the_reply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _scenario(monkeypatch, "db-diskfull") == [1]


@pytest.mark.parametrize("fail", ["copy-enospc", "eio-read", "db-eio"])
def test_a_one_off_ingest_failure_is_retried_without_a_new_announcement(
    monkeypatch: pytest.MonkeyPatch, fail: str
) -> None:
    assert _scenario(monkeypatch, fail) == [1], f"{fail}: the reply was never ingested"


def test_a_refused_row_whose_audit_record_fails_still_flows() -> None:
    """A row the host refuses becomes a placeholder, recorded in the audit log; a full audit
    disk aborted the batch and the good reply after it waited (found by a review)."""

    async def go() -> list[tuple[int, str]]:
        sessions, messages, data, control, clock = real_services()
        await sessions.create(AGENT, SID)
        await messages.send(SID, "hello")

        def full(*a: Any, **k: Any) -> None:
            raise DiskFull("appending to audit log: No space left on device")

        messages._refusals._audit.record = full  # type: ignore[method-assign]
        rows = data.outbound_rows.setdefault(SID, [])
        rows.append((1, 1, clock.time(), b"\xff not utf-8"))
        rows.append((2, 1, clock.time(), b"the answer"))
        await _announce(control, SID, 2)
        got = [(r.seq, r.body) async for r in messages.watch(SID, 0, False)]
        await sessions.close()
        return got

    got = asyncio.run(go())
    assert got == [(1, "[ironclawd refused reply 1: body is not valid UTF-8]"), (2, "the answer")]


def test_a_new_session_of_a_removed_ones_id_gets_a_fresh_window_of_refusal_records() -> None:
    """The refusal windows were kept per session id for the daemon's life: a new session given
    a removed one's id had its first refusals go unrecorded (found by a review)."""

    async def go() -> int:
        sessions, messages, data, _control, clock = real_services()
        audit = messages._refusals._audit
        assert isinstance(audit, RecordingAudit)
        await sessions.create(AGENT, SID)
        data.outbound_rows.setdefault(SID, []).append((2, 1, clock.time(), b"after a gap"))
        for _ in range(25):
            await messages.ingest(SID)
        await sessions.remove(SID, force=True)
        await sessions.create(AGENT, SID)
        data.outbound_rows.setdefault(SID, []).append((2, 1, clock.time(), b"after a gap"))
        before = len(audit.records)
        await messages.ingest(SID)
        await sessions.close()
        return len(audit.records) - before

    assert asyncio.run(go()) == 1


# A retry is not audited again (found by a review of this stop's diff): a crafted file left by
# a session that then stopped made one record a minute for as long as the session existed.
def test_a_crafted_outbound_file_of_a_stopped_session_is_not_audited_forever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(messaging, "INGEST_RETRY_SECONDS", 0.001)
    monkeypatch.setattr(messaging, "INGEST_RETRY_MAX_SECONDS", 0.002)

    async def go() -> tuple[int, int]:
        sessions, messages, data, control, clock = real_services()
        audit = messages._refusals._audit
        assert isinstance(audit, RecordingAudit)
        await sessions.create(AGENT, SID)
        real_outbound = data.outbound

        def outbound(sid: str, uid: int) -> Any:
            reader = real_outbound(sid, uid)

            def read_after(*a: Any) -> Any:  # the box left a file that cannot be read
                raise HostError("reading .../outbound.db: file is not a database")

            reader.read_after = read_after  # type: ignore[method-assign,assignment]
            return reader

        data.outbound = outbound  # type: ignore[method-assign]
        await _announce(control, SID, 1)  # announced once
        await sessions.stop(SID)

        def refused() -> int:
            return sum(1 for r in audit.records if "outbound.refused" in str(r))

        at_stop = refused()
        for _ in range(30):  # 30 "minutes" of the stopped session
            clock.advance(61)
            await asyncio.sleep(0.01)
        later = refused()
        await sessions.close()
        return at_stop, later

    at_stop, later = asyncio.run(go())
    assert later - at_stop < 5, f"{later - at_stop} refusal records after the session stopped"
