"""The agent's side of inbound.db (agent/queues.py) keeps one read-only keyed connection for
its life (issue 17: opening and keying one per message cost more than the read) and still sees
every commit of the host's; a read that fails or comes back short drops it and the next try
opens a fresh one (a commit caught half-way may have left pages of it in the cache)."""

from __future__ import annotations

import contextlib
import secrets
import threading
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


def test_pruning_drops_ingested_rows_but_the_newest_and_the_file_shrinks(tmp_path: Path) -> None:
    """``Outbound.prune`` ("ingested <seq>" from the host): the rows up to seq go, all but the
    newest, whose seq and in_reply_to are where the next seq and a restarted agent resume; a new
    file gives the freed pages back (auto_vacuum = INCREMENTAL), so it does not grow with the
    session's age."""
    key = secrets.token_bytes(32)
    path = tmp_path / "outbound.db"
    out = queues.Outbound(path, key)
    assert out._db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    for n in range(1, 201):
        assert out.append(n, "x" * 2000) == n
    full = path.stat().st_size
    out.prune(150)  # the host ingested up to 150
    rows = [r[0] for r in out._db.execute("SELECT seq FROM messages ORDER BY seq")]
    assert rows == list(range(151, 201))
    assert path.stat().st_size < full / 2
    out.prune(10_000)  # past the newest: the newest stays
    assert [r[0] for r in out._db.execute("SELECT seq FROM messages")] == [200]
    assert (out.last_seq(), out.last_answered()) == (200, 200)
    assert out.append(201, "next") == 201  # seqs go on from the newest
    out._db.close()
    again = queues.Outbound(path, key)  # a restarted agent resumes where it was
    assert (again.last_seq(), again.last_answered()) == (201, 201)
    again._db.close()


def test_an_older_file_is_pruned_and_reuses_its_pages(tmp_path: Path) -> None:
    """A file made before auto_vacuum keeps its size after pruning, and new rows reuse the freed
    pages instead of growing it."""
    key = secrets.token_bytes(32)
    path = tmp_path / "outbound.db"
    old = sqlcipher3.connect(str(path), isolation_level=None)
    old.execute(f"PRAGMA key = \"x'{key.hex()}'\"")
    old.executescript(f"{queues.OUTBOUND_SCHEMA}; PRAGMA user_version = {queues.QUEUE_VERSION};")
    old.close()
    out = queues.Outbound(path, key)
    assert out._db.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    for n in range(1, 101):
        out.append(n, "x" * 2000)
    full = path.stat().st_size
    out.prune(100)
    for n in range(101, 181):
        out.append(n, "x" * 2000)
    assert path.stat().st_size == full
    out._db.close()


def test_pruning_a_large_reply_needs_little_journal(tmp_path: Path) -> None:
    """The tmpfs is small and may be nearly full when pruning matters most: dropping a large
    reply must not journal the whole file (SQLCipher's default secure_delete overwrote every
    freed page, so it did: 21.9 MB of journal for a 21.9 MB file), nor give the pages back in
    one transaction."""
    key = secrets.token_bytes(32)
    path = tmp_path / "outbound.db"
    out = queues.Outbound(path, key)
    assert out._db.execute("PRAGMA secure_delete").fetchone()[0] == 0
    out.append(1, "y" * (8 * 1024 * 1024))
    for n in range(2, 2002):
        out.append(n, f"bulk {n}")
    size = path.stat().st_size
    journal = Path(f"{path}-journal")
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError):
                peak[0] = max(peak[0], journal.stat().st_size)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        out.prune(2001)
    finally:
        done.set()
        watcher.join()
    assert path.stat().st_size < size / 100
    assert peak[0] < size / 8, (peak[0], size)
    out._db.close()
