"""One read of the agent's outbound.db takes the rows of one batch (store/outbound.py
BATCH_BYTES) and reads little more of the file, and each batch goes to the state DB in one
transaction, under the lock every write of it takes. Real files, the agent's own queue code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.queues import Outbound as AgentOutbound
from ironclawd.store import outbound
from ironclawd.store.outbound import OutboundReader

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
