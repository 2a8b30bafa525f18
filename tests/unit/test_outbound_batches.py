"""One read of the agent's outbound.db takes the rows of one batch (store/outbound.py
BATCH_BYTES) and reads no row past it, and each batch goes to the state DB in one
transaction, under the lock every write of it takes. Real files, the agent's own queue code."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from agent.queues import Outbound as AgentOutbound
from ironclawd.store import outbound
from ironclawd.store.outbound import OutboundReader
from tests.unit.reply_world import AGENT, world

KEY = bytes(range(32))
CAP = 1 << 20
ROW = 256 * 1024


def _read_bytes() -> int:
    """What this process has read so far (read and pread calls: SQLite's reads of a copy)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_a_read_decrypts_nothing_past_its_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows were fetched 64 at a time: a read whose batch one 1 MiB row filled stepped (read
    and decrypted) up to 63 more rows, 64 MiB at the default caps, and threw them away; so each
    batch cost what 64 rows do, and a smaller batch only more of them. Then the driver's step
    one row ahead still read the row after the batch: a third of a 2 MiB batch of 1 MiB rows.
    Now the read ends at the row that fills its batch, found from the rows' lengths."""
    monkeypatch.setattr(outbound, "BATCH_BYTES", ROW)
    monkeypatch.setattr(outbound, "RACY_SECONDS", -1.0)  # the copy is kept between the reads
    directory = tmp_path / "outbound"
    directory.mkdir(mode=0o700)
    agent = AgentOutbound(directory / "outbound.db", KEY)
    for n in range(1, 41):
        agent.append(n, f"{n}".ljust(ROW, "x"))
    reader = OutboundReader(directory, KEY, os.getuid(), tmp_path / "scratch", 1 << 26)
    assert [row[0] for row in reader.read_after(0, 1000, CAP)] == [1]  # the copy is taken
    before = _read_bytes()
    assert [row[0] for row in reader.read_after(1, 1000, CAP)] == [2]
    read = _read_bytes() - before
    # Before: 10 MiB (64 rows a fetch), then 0.5 MiB (the row after the batch too).
    assert read < ROW * 3 // 2, f"{read} bytes of the file read for one row of {ROW}"


def test_one_sessions_replies_hold_the_state_db_for_2_mib_at_a_time(tmp_path: Path) -> None:
    """Each batch is one transaction of the state DB under its one lock, which every other
    session's writes and reads wait for: ~12 ms a MiB here, so 8 MiB batches held it ~100 ms at
    a time. 2 MiB ones hold it ~25 ms at the same throughput (store/outbound.py BATCH_BYTES)."""
    mib = "r" * (1 << 20)

    async def go() -> list[int]:
        w = world(tmp_path)
        batches: list[int] = []
        real = w.store.add_replies

        def add_replies(sid: str, replies: Any, usage: Any = None) -> None:
            batches.append(sum(len(r.body) for r in replies))
            real(sid, replies, usage)

        w.store.add_replies = add_replies  # type: ignore[method-assign]
        await w.sessions.create(AGENT, "b1gb4tch5e55")
        for n in range(1, 11):
            await w.messages.send("b1gb4tch5e55", f"message {n}")
        await w.write("b1gb4tch5e55", [(n, mib) for n in range(1, 11)])
        await w.sessions.close()
        w.store.close()
        return batches

    assert asyncio.run(go()) == [2 << 20] * 5  # before: [8 MiB, 2 MiB]
