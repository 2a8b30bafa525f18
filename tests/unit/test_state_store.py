from __future__ import annotations

from pathlib import Path

import pytest
import sqlcipher3

from ironclawd.domain.session import Session, State, transition
from ironclawd.errors import AlreadyExists, HostError, NotFound
from ironclawd.store import state
from ironclawd.store.state import StateStore

KEY = bytes(range(32))


def _session(sid: str = "abcd1234") -> Session:
    return Session(sid, "demo", State.CREATING, 1.0, 1.0, 1.0)


def test_transitions_persist_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = StateStore(path, KEY)
    store.insert(_session())
    store.save(transition(_session(), State.FAILED, 5.0, "why"))
    store.close()
    again = StateStore(path, KEY)
    got = again.get("abcd1234")
    assert (got.state, got.error, got.updated_at) == (State.FAILED, "why", 5.0)
    assert (path.stat().st_mode & 0o777) == 0o600


def test_duplicate_and_missing(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db", KEY)
    store.insert(_session())
    with pytest.raises(AlreadyExists):
        store.insert(_session())
    with pytest.raises(NotFound):
        store.get("zzzz9999")
    with pytest.raises(NotFound):
        store.save(_session("zzzz9999"))
    store.delete("abcd1234")
    assert store.list_sessions() == []


def test_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    StateStore(path, KEY).close()
    db = sqlcipher3.connect(str(path))
    db.execute(f"PRAGMA key = \"x'{KEY.hex()}'\"")
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    with pytest.raises(HostError, match="newer than this ironclawd"):
        StateStore(path, KEY)


def test_a_schema_4_database_is_migrated_keeping_its_data(tmp_path: Path) -> None:
    """A state DB from before the pruned seq (schema 4) gains its table; what it held stays."""
    path = tmp_path / "state.db"
    db = sqlcipher3.connect(str(path), isolation_level=None)
    db.execute(f"PRAGMA key = \"x'{KEY.hex()}'\"")
    for step in range(1, 5):
        db.executescript(f"BEGIN; {state._MIGRATIONS[step]}; PRAGMA user_version = {step}; COMMIT;")
    db.execute(
        "INSERT INTO sessions (sid, agent, state, created_at, updated_at, last_active_at) "
        "VALUES ('abcd1234', 'demo', 'running', 1.0, 1.0, 1.0)"
    )
    db.close()
    store = StateStore(path, KEY)
    assert store.get("abcd1234").state is State.RUNNING
    assert store.pruned("abcd1234") == 0
    store.set_pruned("abcd1234", 256)
    store.close()
    assert StateStore(path, KEY).pruned("abcd1234") == 256


def test_the_restart_mark_persists_as_a_field_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = StateStore(path, KEY)
    store.insert(_session())
    marked = transition(transition(_session(), State.FAILED, 2.0), State.STOPPED, 3.0)
    store.save(transition(marked, State.STARTING, 4.0, restarting=True))
    store.close()
    got = StateStore(path, KEY).get("abcd1234")
    assert (got.state, got.restarting, got.error) == (State.STARTING, True, "")


def test_a_schema_8_restart_mark_in_error_becomes_the_restarting_field(tmp_path: Path) -> None:
    """A daemon before schema 9 marked a session its change's restart had stopped with a text
    in ``error``; it is the mark after the upgrade, and no error any more (a cut restart it
    left is still started by the next start). Any other error stays an error."""
    old_text = (
        "restarting on its agent's new spec: it starts again when the approved change is applied"
    )
    path = tmp_path / "state.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(state, "SCHEMA_VERSION", 8)
        old = StateStore(path, KEY)
        with old.shared("writing sessions as schema 8 did") as db:
            for sid, error in (("abcd1234", old_text), ("efgh5678", "sandbox exited")):
                db.execute(
                    "INSERT INTO sessions (sid, agent, state, created_at, updated_at, "
                    "last_active_at, error) VALUES (?, 'demo', 'stopped', 1.0, 1.0, 1.0, ?)",
                    (sid, error),
                )
        old.close()
    store = StateStore(path, KEY)
    marked, other = store.get("abcd1234"), store.get("efgh5678")
    assert (marked.restarting, marked.error) == (True, "")
    assert (other.restarting, other.error) == (False, "sandbox exited")
