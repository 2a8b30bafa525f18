"""Files another ironclawd version made (an upgrade, or a downgrade to this version): a file of
a format this version does not know is refused, naming the file, the version found and the one
known; it is never read as if it were this version's, nor written over."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlcipher3

from ironclawd.errors import HostError
from ironclawd.store import queues

KEY = bytes(range(32))


def _set_version(path: Path, version: int) -> None:
    db = sqlcipher3.connect(str(path), isolation_level=None)
    db.execute(f"PRAGMA key = \"x'{KEY.hex()}'\"")
    db.execute(f"PRAGMA user_version = {version}")
    db.close()


def test_an_inbound_queue_of_a_newer_version_is_refused_not_appended_to(tmp_path: Path) -> None:
    writer = queues.InboundWriter(tmp_path, KEY, os.getgid())
    assert writer.append("before the downgrade", 1.0, None) == (1, True)
    writer.close()
    path = tmp_path / queues.INBOUND_FILE
    _set_version(path, queues.QUEUE_VERSION + 1)
    with pytest.raises(HostError, match=rf"refusing inbound queue {path}: format version "
                       rf"{queues.QUEUE_VERSION + 1}, this ironclawd writes version "
                       rf"{queues.QUEUE_VERSION}"):  # fmt: skip
        queues.InboundWriter(tmp_path, KEY, os.getgid())
    again = sqlcipher3.connect(str(path))
    again.execute(f"PRAGMA key = \"x'{KEY.hex()}'\"")
    assert again.execute("SELECT body FROM messages").fetchall() == [("before the downgrade",)]
    assert again.execute("PRAGMA user_version").fetchone()[0] == queues.QUEUE_VERSION + 1
    again.close()
