"""A claim seals a pooled sandbox (store/session_data.py ``seal``) over real SQLCipher files in a
temporary directory: the host makes the session's empty outbound.db the way the agent would (the
agent then only opens it), and writes the key into the placeholder only after it, so an agent
that polls its key file never finds the key without the file; something the pooled agent left
in its outbound directory refuses the claim, and the key is not written."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.queues import Outbound
from ironclawd.errors import HostError
from ironclawd.store import keys
from ironclawd.store.keys import MasterKey
from ironclawd.store.session_data import DataLayout, SessionDataStore
from ironclawd.store.state import StateStore

MASTER = bytes(range(32))
SID = "p00l3d5a1b2c"
UID, GID = os.getuid(), os.getgid()


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SessionDataStore]:
    """A pooled sandbox's mount sources as ``prepare_pooled`` leaves them, made here without
    its tmpfs mount and its chowns (the unit tier changes no owner; this process's uid stands
    for the agent's): empty queue directories and an empty key file. Key files belong on a
    tmpfs; that check is keys.py's own, here any directory passes."""
    monkeypatch.setattr(keys, "_on_tmpfs", lambda directory: True)
    store = StateStore(tmp_path / "state.db", MASTER)
    layout = DataLayout(queues_dir=tmp_path / "queues", keys_dir=tmp_path / "keys",
                        scratch_dir=tmp_path / "scratch", state_dir=tmp_path)  # fmt: skip
    for directory, mode in (("inbound", 0o750), ("outbound", 0o700)):
        (layout.queues_dir / SID / directory).mkdir(mode=mode, parents=True)
    layout.keys_dir.mkdir(mode=0o711)
    os.close(os.open(layout.keys_dir / SID, os.O_CREAT | os.O_WRONLY, 0o400))
    try:
        yield SessionDataStore(store, MasterKey(MASTER, "test"), layout)
    finally:
        store.close()


def test_the_claim_makes_the_agents_empty_queue_before_the_key(data: SessionDataStore) -> None:
    key_file = data.key_path(SID)
    made = data.outbound_dir(SID) / "outbound.db"
    key = data.seal(SID, UID, GID)
    assert key_file.read_bytes() == key.hex().encode()
    st = os.lstat(made)
    assert stat.S_ISREG(st.st_mode)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o600, UID, GID)
    # The agent's own code opens it as if it had made it: no schema to write, pages given back.
    queue = Outbound(made, key)
    assert queue.last_seq() == 0
    assert queue._gives_back
    assert queue.append(1, "hello") == 1
    assert data.outbound(SID, UID).read_after(0, 10, 100)[0][3] == b"hello"


@pytest.mark.parametrize("planted", ["file", "symlink"])
def test_a_file_the_pooled_agent_left_refuses_the_claim_and_no_key_is_written(
    data: SessionDataStore, tmp_path: Path, planted: str
) -> None:
    left = data.outbound_dir(SID) / "outbound.db"
    elsewhere = tmp_path / "elsewhere.db"
    if planted == "file":
        left.write_bytes(b"not a queue")
    else:
        left.symlink_to(elsewhere)
    with pytest.raises(HostError, match=f"claiming a pooled sandbox for session {SID}: .*exists"):
        data.seal(SID, UID, GID)
    assert data.key_path(SID).read_bytes() == b""  # the placeholder stays empty
    assert not elsewhere.exists()  # the link was not followed
    if planted == "file":
        assert left.read_bytes() == b"not a queue"  # and nothing was written over
