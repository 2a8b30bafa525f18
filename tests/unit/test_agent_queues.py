"""The agent's side of inbound.db (agent/queues.py) keeps one read-only keyed connection for
its life (issue 17: opening and keying one per message cost more than the read) and still sees
every commit of the host's; a read that fails or comes back short drops it and the next try
opens a fresh one (a commit caught half-way may have left pages of it in the cache)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
import sqlcipher3

from agent import queues
from agent.queues import Inbound, QueueError
from ironclawd.store.queues import INBOUND_SCHEMA


def _host(path: Path, key: bytes) -> sqlcipher3.Connection:
    db = sqlcipher3.connect(str(path), isolation_level=None)
    db.execute(f"PRAGMA key = \"x'{key.hex()}'\"")
    db.execute("PRAGMA journal_mode = DELETE")
    db.execute(INBOUND_SCHEMA)
    return db


def _send(db: sqlcipher3.Connection, *bodies: str) -> None:
    for body in bodies:
        db.execute("INSERT INTO messages (created_at, body) VALUES (1.0, ?)", (body,))


def test_one_connection_sees_every_commit(tmp_path: Path) -> None:
    key = secrets.token_bytes(32)
    path = tmp_path / "inbound.db"
    inbound = Inbound(path, key)
    assert inbound.read_after(0, None) == []  # no file yet: nothing to read
    host = _host(path, key)
    _send(host, "one", "two")
    assert inbound.read_after(0, 2) == [(1, "one"), (2, "two")]
    kept = inbound._conn
    assert kept is not None
    for n in range(3, 40):
        _send(host, f"m{n}")
        assert inbound.read_after(n - 1, n) == [(n, f"m{n}")]
    assert inbound._conn is kept
    assert inbound.read_after(37, None) == [(38, "m38"), (39, "m39")]
    inbound.close()
    host.close()


def test_a_short_read_drops_the_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queues, "READ_ATTEMPTS", 3)
    key = secrets.token_bytes(32)
    path = tmp_path / "inbound.db"
    host = _host(path, key)
    _send(host, "one")
    inbound = Inbound(path, key)
    assert inbound.read_after(0, 1) == [(1, "one")]
    with pytest.raises(QueueError, match="announced 2"):
        inbound.read_after(1, 2)  # announced, not there
    assert inbound._conn is None
    _send(host, "two")
    assert inbound.read_after(1, 2) == [(2, "two")]
    inbound.close()
    host.close()


def test_a_wrong_key_is_retried_then_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queues, "READ_ATTEMPTS", 2)
    path = tmp_path / "inbound.db"
    host = _host(path, secrets.token_bytes(32))
    _send(host, "one")
    with pytest.raises(QueueError, match="gave up"):
        Inbound(path, secrets.token_bytes(32)).read_after(0, 1)
    host.close()
