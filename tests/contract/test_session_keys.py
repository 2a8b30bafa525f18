"""``ports.SessionData``'s key and pool lifecycle: the fake (tests/fakes/host.py
``FakeSessionData``) and the real ``SessionDataStore`` (store/session_data.py) give a session
its key when it is prepared or, for a pooled sandbox, only when it is sealed; keep it through a
release; forget it at destroy; and refuse to pool or seal a session that has one.

The real one mounts each session's outbound tmpfs and writes keys to a tmpfs, so it runs only
under ``--real-host`` inside the private systemd (tests/integration/test_contracts_real.py),
as root, with its key directory on a tmpfs of its own below /run (tests/contract/
test_queues.py covers the queues themselves on plain files)."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ironclawd.domain.session import new_sid
from ironclawd.errors import HostError
from ironclawd.ports import SessionData
from ironclawd.store.keys import MasterKey
from ironclawd.store.session_data import DataLayout, SessionDataStore
from ironclawd.store.state import StateStore
from tests.fakes import FakeSessionData

UID = GID = 65534


@pytest.fixture
def data(host_impl: str, tmp_path: Path) -> Iterator[SessionData]:
    if host_impl == "fake":
        yield FakeSessionData()
        return
    run = Path("/run") / f"ironclaw-contract-{secrets.token_hex(4)}"
    run.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0711", "tmpfs", str(run)],
                   check=True)  # fmt: skip
    key = secrets.token_bytes(32)
    store = StateStore(tmp_path / "state.db", key)
    layout = DataLayout(queues_dir=tmp_path / "queues", keys_dir=run / "keys",
                        scratch_dir=tmp_path / "scratch", state_dir=tmp_path)  # fmt: skip
    real = SessionDataStore(store, MasterKey(key, "contract"), layout)
    try:
        yield real
    finally:
        for sid in real.list_sids():
            real.destroy(sid)
        store.close()
        subprocess.run(["umount", str(run)], check=True)
        run.rmdir()


def test_a_prepared_session_keeps_its_key_through_a_release_until_destroyed(
    data: SessionData,
) -> None:
    sid = new_sid()
    key = data.prepare(sid, UID, GID)
    assert len(key) == 32
    assert data.prepare(sid, UID, GID) == key  # again (a restart of its sandbox): the same key
    assert data.key(sid) == key
    assert sid in data.list_sids()
    data.release(sid)
    assert data.key(sid) == key
    data.destroy(sid)
    assert sid not in data.list_sids()
    with pytest.raises(HostError, match=f"session {sid}: no key"):
        data.key(sid)
    data.destroy(sid)  # again: nothing to do


def test_each_session_has_a_key_of_its_own(data: SessionData) -> None:
    first, second, pooled = new_sid(), new_sid(), new_sid()
    data.prepare_pooled(pooled, UID, GID)
    keys = {data.prepare(first, UID, GID), data.prepare(second, UID, GID),
            data.seal(pooled, UID, GID)}  # fmt: skip
    assert len(keys) == 3


def test_a_pooled_sandbox_gets_its_key_only_when_sealed_and_once(data: SessionData) -> None:
    sid = new_sid()
    data.prepare_pooled(sid, UID, GID)
    assert sid in data.list_sids()
    with pytest.raises(HostError, match=f"session {sid}: no key"):
        data.key(sid)
    key = data.seal(sid, UID, GID)
    assert len(key) == 32
    assert data.key(sid) == key
    with pytest.raises(HostError, match=f"refusing to seal {sid}"):
        data.seal(sid, UID, GID)
    with pytest.raises(HostError, match=f"refusing to pool {sid}"):
        data.prepare_pooled(sid, UID, GID)
    assert data.key(sid) == key  # neither refusal touched it


def test_a_session_that_was_never_pooled_is_not_sealed(data: SessionData) -> None:
    sid = new_sid()
    with pytest.raises(HostError, match=f"refusing to seal {sid}"):
        data.seal(sid, UID, GID)
    with pytest.raises(HostError, match=f"session {sid}: no key"):
        data.key(sid)  # nothing was left half made
    assert sid not in data.list_sids()


def test_a_seal_that_fails_half_way_leaves_no_key(data: SessionData) -> None:
    """The key is recorded first (a crash must not lose it), so a later step that fails takes
    it back: here the placeholder the box has bind-mounted is not empty any more."""
    sid = new_sid()
    data.prepare_pooled(sid, UID, GID)
    if isinstance(data, FakeSessionData):
        data.fail["data.seal"] = HostError(f"refusing to write session key {sid}: not the "
                                           "empty placeholder")  # fmt: skip
    else:
        assert isinstance(data, SessionDataStore)
        data.key_path(sid).write_bytes(b"planted by the box")
    with pytest.raises(HostError, match="not the empty placeholder"):
        data.seal(sid, UID, GID)
    with pytest.raises(HostError, match=f"session {sid}: no key"):
        data.key(sid)
