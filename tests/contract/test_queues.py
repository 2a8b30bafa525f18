"""``ports.SessionData``, ``InboundQueue`` and ``OutboundRows``: the fakes (tests/fakes/host.py)
and the SQLCipher adapters (store/session_data.py, store/queues.py, store/outbound.py, on real
files in a tmp dir) keep, return and refuse the same things.

What needs a tmpfs mount (``SessionData.prepare``: the outbound quota tmpfs and the key on
/run) is not run here: the real session data is seeded as prepare would, minus the mounts. The
outbound reader insists on root-owned scratch space, so the real parameters need uid 0 (as
the daemon and this repo's test machine have)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from ironclawd.errors import DiskFull, HostError
from ironclawd.ports import InboundQueue, OutboundRows, RawRow, SessionData
from ironclawd.store import queues
from ironclawd.store.keys import MasterKey
from ironclawd.store.outbound import OutboundReader, restore_outbound
from ironclawd.store.queues import InboundWriter
from ironclawd.store.session_data import DataLayout, SessionDataStore
from ironclawd.store.state import StateStore
from tests.fakes import FakeSessionData

KEY = bytes(range(32))
SID = "a1b2c3d4e5f6"


@pytest.fixture(params=["fake", "real"])
def inbound(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[InboundQueue]:
    queue: InboundQueue
    if request.param == "fake":
        data = FakeSessionData()
        data.prepare(SID, 0, 0)
        queue = data.inbound(SID, 0)
    else:
        queue = InboundWriter(tmp_path, KEY, 0)
    try:
        yield queue
    finally:
        queue.close()


def test_inbound_numbers_appends_in_order(inbound: InboundQueue) -> None:
    assert inbound.last_seq() == 0
    assert inbound.append("first", 1.0, None) == (1, True)
    assert inbound.append("second", 2.0, "c-2") == (2, True)
    assert inbound.append("third", 3.0, "") == (3, True)  # "" is no client id
    assert inbound.append("again", 4.0, "") == (4, True)
    assert inbound.last_seq() == 4


def test_inbound_a_repeated_client_id_returns_its_first_seq(inbound: InboundQueue) -> None:
    inbound.append("x", 1.0, None)
    assert inbound.append("hello", 2.0, "c-1") == (2, True)
    assert inbound.append("hello, retried", 3.0, "c-1") == (2, False)
    assert inbound.append("y", 4.0, None) == (3, True)
    assert inbound.last_seq() == 3


ROWS: list[tuple[int, int, float, str]] = [
    (1, 1, 10.0, "one"), (2, 1, 11.0, "two"), (3, 2, 12.0, "x" * 40), (4, 3, 13.0, "four"),
]  # fmt: skip


def _raw(row: tuple[int, int, float, str]) -> RawRow:
    return row[0], row[1], row[2], row[3].encode()


@pytest.fixture(params=["fake", "real"])
def outbound(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[bool], OutboundRows]:
    """``make(written)``: the session's outbound rows, ROWS if ``written``, else no file yet."""

    def make(written: bool) -> OutboundRows:
        if request.param == "fake":
            data = FakeSessionData()
            data.prepare(SID, 0, 0)
            if written:
                data.outbound_rows[SID] = [_raw(r) for r in ROWS]
            return data.outbound(SID, 0)
        directory, scratch = tmp_path / "outbound", tmp_path / "scratch"
        directory.mkdir()
        if written:
            restore_outbound(directory, KEY, (0, 0), ROWS, scratch)
        return OutboundReader(directory, KEY, 0, scratch, 1024 * 1024)

    return make


def test_outbound_rows_read_in_order_after_a_seq(
    outbound: Callable[[bool], OutboundRows],
) -> None:
    rows = outbound(True)
    assert rows.read_after(0, 100, 1000) == [_raw(r) for r in ROWS]
    assert rows.read_after(1, 2, 1000) == [_raw(r) for r in ROWS[1:3]]
    assert rows.read_after(4, 100, 1000) == []
    assert rows.read_range(2, 3, 1000) == [_raw(r) for r in ROWS[1:3]]


def test_outbound_a_body_over_the_cap_reads_as_none(
    outbound: Callable[[bool], OutboundRows],
) -> None:
    rows = outbound(True)
    assert rows.read_after(2, 1, 39) == [(3, 2, 12.0, None)]
    assert rows.read_range(3, 3, 40) == [_raw(ROWS[2])]


def test_outbound_before_the_agent_wrote_anything(
    outbound: Callable[[bool], OutboundRows],
) -> None:
    rows = outbound(False)
    assert rows.read_after(0, 100, 1000) == []
    with pytest.raises(HostError, match=r"outbound\.db does not exist"):
        rows.read_range(1, 1, 1000)


@pytest.fixture(params=["fake", "real"])
def session_data(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[SessionData, Callable[[str], None], Callable[[bool], None]]]:
    """(data, seed(sid): give sid a key and queue dirs, fill(full): the disk is (not) full)."""
    if request.param == "fake":
        fake = FakeSessionData()

        def seed_fake(sid: str) -> None:
            fake.keys.setdefault(sid, bytes(32))

        def fill_fake(full: bool) -> None:
            fake.full = full

        yield fake, seed_fake, fill_fake
        return
    store, master = StateStore(tmp_path / "state.db", KEY), MasterKey(KEY, "test")
    layout = DataLayout(queues_dir=tmp_path / "queues", keys_dir=tmp_path / "keys",
                        scratch_dir=tmp_path / "scratch", state_dir=tmp_path)  # fmt: skip
    real = SessionDataStore(store, master, layout)

    def seed(sid: str) -> None:  # prepare() without its two mounts
        store.put_wrapped_key(sid, master.wrap(sid, bytes(32)))
        queues.prepare_queue_dirs(layout.queues_dir, sid, 0, 0)

    def fill_real(full: bool) -> None:
        real.layout = replace(layout, min_free_bytes=2**62 if full else 0)

    try:
        yield real, seed, fill_real
    finally:
        store.close()


def test_session_data_without_a_key_refuses(
    session_data: tuple[SessionData, Callable[[str], None], Callable[[bool], None]],
) -> None:
    data, _, _ = session_data
    for use in (lambda: data.key(SID), lambda: data.inbound(SID, 0),
                lambda: data.outbound(SID, 0)):  # fmt: skip
        with pytest.raises(HostError, match=f"session {SID}: no key"):
            use()
    data.destroy(SID)  # nothing to destroy: fine
    data.release(SID)


def test_session_data_queues_live_until_destroyed(
    session_data: tuple[SessionData, Callable[[str], None], Callable[[bool], None]],
) -> None:
    data, seed, _ = session_data
    seed(SID)
    key = data.key(SID)
    assert len(key) == 32
    queue = data.inbound(SID, 0)
    assert queue.append("hi", 1.0, "c") == (1, True)
    queue.close()
    assert data.inbound(SID, 0).last_seq() == 1  # the same queue again
    assert data.outbound(SID, 0).read_after(0, 10, 100) == []
    data.release(SID)
    assert data.key(SID) == key  # released: off tmpfs, not forgotten
    data.destroy(SID)
    with pytest.raises(HostError, match=f"session {SID}: no key"):
        data.key(SID)


def test_session_data_refuses_new_work_while_the_disk_is_full(
    session_data: tuple[SessionData, Callable[[str], None], Callable[[bool], None]],
) -> None:
    data, _, fill = session_data
    data.check_space("creating session s1")
    fill(True)
    with pytest.raises(DiskFull, match="creating session s1: refused: the state directory"):
        data.check_space("creating session s1")
    fill(False)
    data.check_space("creating session s1")
