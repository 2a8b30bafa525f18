"""Messages held for an operator (services/inbox_held.py) are capped per channel, in count and
in bytes: under ``unknown = "hold"`` every stranger's message was a row of the state DB until an
operator decided, so strangers each under the sender rate filled it (600 a minute of 16 KiB),
and ``ironctl channel held`` and ``channel show`` read every row. Past their share of the cap a
stranger's message is dropped (webhook: 403) and counted; a message already held stays held.
The rest of the cap is a reserve for messages of allowed senders whose receive keeps failing:
when strangers could fill it all, such a message was tried again at every offer, without the
bound of ``MAX_RECEIVE_TRIES``. Past the whole cap one is dropped and counted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ironclawd.errors import IronclawError, SandboxError
from ironclawd.ports.channel_records import HeldMessage
from ironclawd.ports.channels import Admission
from ironclawd.services import inbox as inbox_module
from ironclawd.services import inbox_held
from ironclawd.store import state
from ironclawd.store.channel_state import ChannelState
from ironclawd.store.state import StateStore
from tests.unit.test_inbox import ALICE, ROOM, World, agent, run

KEY = bytes(range(32))


@pytest.fixture(autouse=True)
def small_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strangers may hold 3 messages and 100 bytes; failing messages 1 and 50 more."""
    monkeypatch.setattr(inbox_held, "MAX_HELD_MESSAGES", 4)
    monkeypatch.setattr(inbox_held, "HELD_RESERVE_MESSAGES", 1)
    monkeypatch.setattr(inbox_held, "MAX_HELD_BYTES", 150)
    monkeypatch.setattr(inbox_held, "HELD_RESERVE_BYTES", 50)


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


async def strangers_fill_their_share(w: World) -> None:
    got = []
    for n in range(4):
        await w.adapter.inject("spam", sender=f"@stranger{n}:evil.test", where=ROOM)
        got.append(w.adapter.last_receipt.admission)
    assert got == [Admission.HELD] * 3 + [Admission.DROPPED]  # the reserve is not theirs


def failing_sends(w: World) -> list[int]:
    """Every send to a queue raises (the session cannot start); how many there were."""
    tries = [0]

    async def send(sid: str, body: str, client_id: str = "") -> object:
        tries[0] += 1  # each is a start of the session's sandbox in the real service
        raise SandboxError("starting session: runsc: exit status 128")

    w.messages.send = send  # type: ignore[method-assign, assignment]
    return tries


async def offer(w: World, times: int, event_id: str) -> None:
    """The channel offers the event ``times`` times (Matrix syncs a batch again after an
    error; a webhook sender retries)."""
    for _ in range(times):
        try:
            await w.adapter.inject("help", sender=ALICE, where=ROOM, event_id=event_id)
        except IronclawError:
            continue


def test_strangers_cannot_crowd_out_a_failing_receive() -> None:
    async def test(w: World) -> None:
        await strangers_fill_their_share(w)
        tries = failing_sends(w)
        await offer(w, 50, "$1")
        assert tries[0] == inbox_module.MAX_RECEIVE_TRIES
        assert w.adapter.last_receipt.admission is Admission.HELD
        assert w.inbox.held()[-1].event_id == "$1"
        assert w.inbox.report("chat").status.counters["receive_failed_held"] == 1

    run(test, agent(unknown="hold"))


def test_past_the_whole_cap_a_failing_receive_is_dropped_and_counted() -> None:
    async def test(w: World) -> None:
        await strangers_fill_their_share(w)
        tries = failing_sends(w)
        await offer(w, inbox_module.MAX_RECEIVE_TRIES, "$0")  # fills the reserve
        tries[0] = 0
        await offer(w, 50, "$1")
        assert tries[0] == inbox_module.MAX_RECEIVE_TRIES
        receipt = w.adapter.last_receipt
        assert receipt.admission is Admission.DROPPED  # the channel moves on (webhook: 403)
        assert "could not be queued" in receipt.reason
        assert [h.event_id for h in w.inbox.held()][-1] == "$0"
        assert len(w.inbox.held()) == 4
        # Its receive row is forgotten: the session's next start does not queue it after all.
        assert [r.event_id for r in w.records.receiving()] == ["$0"]
        counters = w.inbox.report("chat").status.counters
        assert counters["receive_failed_dropped"] >= 1
        # Once an operator decided, the same event offered again is held, and still not tried.
        w.inbox.drop_held(w.inbox.held()[0].id)
        await offer(w, 1, "$1")
        assert w.adapter.last_receipt.admission is Admission.HELD
        assert tries[0] == inbox_module.MAX_RECEIVE_TRIES

    run(test, agent(unknown="hold"))


def test_a_failing_receive_dropped_past_the_cap_is_not_queued_at_the_next_start() -> None:
    async def test(w: World) -> None:
        await strangers_fill_their_share(w)
        real = w.messages.send
        failing_sends(w)
        await offer(w, inbox_module.MAX_RECEIVE_TRIES, "$0")
        await offer(w, inbox_module.MAX_RECEIVE_TRIES, "$1")
        assert w.adapter.last_receipt.admission is Admission.DROPPED
        w.messages.send = real  # type: ignore[method-assign]
        await w.restart()
        assert w.queued() == ["help"]  # $0, held in the reserve, finished by the start
        (queued,) = w.messages.inbound.values()
        assert [cid for _text, cid in queued] == [inbox_module.client_id("chat", "$0")]

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
