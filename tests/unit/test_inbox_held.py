"""Messages held for an operator (services/inbox.py) are capped per channel, in count and in
bytes: under ``unknown = "hold"`` every stranger's message was a row of the state DB until an
operator decided, so strangers each under the sender rate filled it (600 a minute of 16 KiB),
and ``ironctl channel held`` and ``channel show`` read every row. Past the cap a stranger's
message is dropped (webhook: 403) and counted; a message already held stays held."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ironclawd.errors import ChannelFailed, SandboxError
from ironclawd.ports.channel_records import HeldMessage
from ironclawd.ports.channels import Admission
from ironclawd.services import inbox as inbox_module
from ironclawd.store import state
from ironclawd.store.channel_state import ChannelState
from ironclawd.store.state import StateStore
from tests.unit.test_inbox import ALICE, ROOM, World, agent, run

KEY = bytes(range(32))


@pytest.fixture(autouse=True)
def small_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inbox_module, "MAX_HELD_MESSAGES", 3)
    monkeypatch.setattr(inbox_module, "MAX_HELD_BYTES", 100)


def test_strangers_past_the_cap_are_dropped_and_counted() -> None:
    async def test(w: World) -> None:
        got = []
        for n in range(5):
            await w.adapter.inject(f"let me in {n}", sender=f"@stranger{n}:evil.test",
                                   where=ROOM, event_id=f"$s{n}")  # fmt: skip
            got.append(w.adapter.last_receipt.admission)
        assert got == [Admission.HELD] * 3 + [Admission.DROPPED] * 2
        assert "try again later" in w.adapter.last_receipt.reason
        assert [h.event_id for h in w.inbox.held()] == ["$s0", "$s1", "$s2"]
        report = w.inbox.report("chat")
        assert (report.held, report.status.counters["held_full"]) == (3, 2)
        # Offered again, a held one is still held; once an operator decided one, another fits.
        await w.adapter.inject("let me in 1", sender="@stranger1:evil.test", where=ROOM,
                               event_id="$s1")  # fmt: skip
        assert w.adapter.last_receipt.admission is Admission.HELD
        w.inbox.drop_held(w.inbox.held()[0].id)
        await w.adapter.inject("let me in 3", sender="@stranger3:evil.test", where=ROOM,
                               event_id="$s3")  # fmt: skip
        assert w.adapter.last_receipt.admission is Admission.HELD
        assert w.queued() == []

    run(test, agent(unknown="hold"))


def test_the_bytes_held_are_capped_too() -> None:
    async def test(w: World) -> None:
        got = []
        for text in ("x" * 60, "y" * 41, "z" * 40):  # 100 bytes at most
            await w.adapter.inject(text, sender=f"@{text[0]}:evil.test", where=ROOM)
            got.append(w.adapter.last_receipt.admission)
        assert got == [Admission.HELD, Admission.DROPPED, Admission.HELD]

    run(test, agent(unknown="hold"))


def test_a_failing_receive_is_not_dropped_when_nothing_more_can_be_held() -> None:
    """A message of an allowed sender whose receive keeps failing is held only while there
    is room; else it stays with its channel, which offers it again (nothing is lost)."""

    async def test(w: World) -> None:
        for n in range(3):
            await w.adapter.inject("spam", sender=f"@stranger{n}:evil.test", where=ROOM)

        async def cannot_start(agent: str, sid: str | None = None) -> object:
            raise SandboxError("starting session x: runsc: exit status 128")

        w.sessions.create = cannot_start  # type: ignore[method-assign, assignment]
        for _ in range(inbox_module.MAX_RECEIVE_TRIES - 1):
            with pytest.raises(SandboxError):
                await w.adapter.inject("help", sender=ALICE, where=ROOM, event_id="$1")
        with pytest.raises(ChannelFailed, match="holds 3 messages or 100 bytes"):
            await w.adapter.inject("help", sender=ALICE, where=ROOM, event_id="$1")
        assert "$1" not in [h.event_id for h in w.inbox.held()]

    run(test, agent(unknown="hold"))


def test_a_schema_7_database_counts_the_bytes_it_held_already(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(state, "SCHEMA_VERSION", 7)
        old = StateStore(path, KEY)
        with old.shared("holding as schema 7 did") as db:
            db.execute(
                "INSERT INTO held (channel, where_, sender, event_id, thread, text, mentioned, "
                "received_at) VALUES ('chat', ?, '@eve', '$1', '', ?, 0, 1.0)",
                (ROOM, "é" * 40),
            )
        old.close()
    store = StateStore(path, KEY)
    try:
        records = ChannelState(store)
        later = HeldMessage(0, "chat", ROOM, "@eve", "$2", "", "x" * 21, False, 2.0)
        assert records.hold(later, 10, 100) is None  # 80 bytes held already, and 21 more
        assert records.hold(replace(later, text="x" * 20), 10, 100) is not None
        assert records.held_count("chat") == 2
    finally:
        store.close()
