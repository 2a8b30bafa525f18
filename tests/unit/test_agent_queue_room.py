"""The agent's outbound.db on a tmpfs that fills up (agent/queues.py): the file stops growing
HEADROOM short of its file system's size, so a full queue refuses a reply as a full disk while
a prune, which is what makes room again, still has space for its journal; and a prune runs in
transactions whose journals stay small however long the backlog.

The file system's size is what ``os.statvfs`` says (monkeypatched: the tmp dir is on a large
disk). What stops the file is SQLite's own ``max_page_count``, the very mechanism the agent
sets from that size, so the refusal is the one the agent meets in its sandbox; the tmpfs's own
ENOSPC past it raises the same ``OperationalError``."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest
import sqlcipher3

from agent import queues

MIB = 1024 * 1024


class _Statvfs:
    def __init__(self, size: int) -> None:
        self.f_frsize, self.f_blocks = 4096, size // 4096


def small_tmpfs(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    real = os.statvfs

    def statvfs(path: Any) -> Any:
        real(path)  # it must exist
        return _Statvfs(size)

    monkeypatch.setattr(os, "statvfs", statvfs)


def fill(out: queues.Outbound, body: str, first: int = 1, most: int = 10_000) -> int:
    """Append replies until the queue is full; the first in_reply_to refused."""
    for n in range(first, first + most):
        try:
            out.append(n, body)
        except sqlcipher3.OperationalError as exc:
            refusal = str(exc)
            break
    else:
        raise AssertionError(f"{most} replies of {len(body)} bytes and the queue was not full")
    assert refusal == "database or disk is full"
    return n


def test_a_full_queue_leaves_headroom_and_a_prune_makes_room_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small_tmpfs(monkeypatch, 4 * MIB)
    path = tmp_path / "outbound.db"
    out = queues.Outbound(path, secrets.token_bytes(32))
    refused = fill(out, "x" * 3000)
    assert path.stat().st_size <= 3 * MIB  # a quarter of a 4 MiB tmpfs is left: 1 MiB
    assert out.last_seq() == refused - 1
    out.prune(refused - 1)  # the host took them all
    assert out.append(refused, "x" * 3000) == refused  # the reply that was refused
    assert fill(out, "x" * 3000, refused + 1) > refused + 100
    out._db.close()


def test_the_headroom_is_at_most_two_mib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small_tmpfs(monkeypatch, 64 * MIB)
    out = queues.Outbound(tmp_path / "outbound.db", secrets.token_bytes(32))
    assert out._db.execute("PRAGMA max_page_count").fetchone()[0] == (62 * MIB) // 4096
    out._db.close()


def test_pruning_a_long_backlog_journals_little_per_transaction(tmp_path: Path) -> None:
    """A session held at a bound for long: its agent's queue holds thousands of small replies
    when the host takes them and offers to prune them all at once. Deleted in one transaction,
    20,000 rows of 300 bytes journaled ~6.5 MiB (every leaf page of the table); the journal of
    each transaction must fit in HEADROOM."""
    path = tmp_path / "outbound.db"
    out = queues.Outbound(path, secrets.token_bytes(32))
    out._db.execute("BEGIN")  # written in one go: the test is about the prune
    for n in range(1, 20_001):
        out.append(n, "z" * 300)
    out._db.execute("COMMIT")
    journal = Path(f"{path}-journal")
    peak = [0]

    def look() -> int:  # SQLite writes a page to the journal as it first changes it
        peak[0] = max(peak[0], journal.stat().st_size if journal.exists() else 0)
        return 0

    out._db.set_progress_handler(look, 100)
    out.prune(20_000)
    out._db.set_progress_handler(None, 0)
    assert [r[0] for r in out._db.execute("SELECT seq FROM messages")] == [20_000]
    assert 0 < peak[0] < 512 * 1024, peak[0]
    assert path.stat().st_size < 64 * 1024
    out._db.close()
