"""Files another ironclawd version made (an upgrade, or a downgrade to this version): a file of
a format this version does not know is refused, naming the file, the version found and the one
known; it is never read as if it were this version's, nor written over."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import sqlcipher3

from agent import queues as agent_queues
from agent.queues import Outbound as AgentOutbound
from ironclawd import filecache
from ironclawd.errors import HostError
from ironclawd.filecache import IdentityCache
from ironclawd.store import outbound, queues
from ironclawd.store.keys import MasterKey

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


def test_an_outbound_queue_of_another_version_is_refused_its_replies_kept(tmp_path: Path) -> None:
    """An agent of another version (adopted after an upgrade or a downgrade) wrote its queue in
    a format this daemon does not know: the read says so, and the rows wait for a daemon that
    knows it, instead of being taken as this version's."""
    outdir = tmp_path / "queues" / "s1" / "outbound"
    outdir.mkdir(parents=True, mode=0o700)
    path = outdir / outbound.OUTBOUND_FILE
    agent = AgentOutbound(path, KEY)
    agent.append(1, "a reply")
    agent._db.close()
    _set_version(path, outbound.OUTBOUND_VERSION + 1)
    reader = outbound.OutboundReader(outdir, KEY, os.getuid(), tmp_path / "scratch", 1 << 20)
    with pytest.raises(HostError, match=rf"refusing outbound\.db: format version "
                       rf"{outbound.OUTBOUND_VERSION + 1}, this ironclawd reads version "
                       rf"{outbound.OUTBOUND_VERSION} .*its replies stay"):  # fmt: skip
        reader.read_after(0, 10, 1000)
    _set_version(path, outbound.OUTBOUND_VERSION)
    assert [row[0] for row in reader.read_after(0, 10, 1000)] == [1]
    reader.close()


def test_the_daemon_and_the_agent_agree_on_the_outbound_format() -> None:
    assert (outbound.OUTBOUND_SCHEMA, outbound.OUTBOUND_VERSION) == (
        agent_queues.OUTBOUND_SCHEMA, agent_queues.QUEUE_VERSION,
    )  # fmt: skip


def test_the_agent_refuses_an_outbound_queue_of_a_newer_version(tmp_path: Path) -> None:
    """A session started again by an older daemon runs the older agent on the file the newer
    agent left on the session's tmpfs: it must not append rows of its format to it."""
    path = tmp_path / "outbound.db"
    newer = AgentOutbound(path, KEY)
    newer.append(1, "a reply")
    newer._db.close()
    _set_version(path, agent_queues.QUEUE_VERSION + 1)
    with pytest.raises(agent_queues.QueueError, match=rf"refusing {path}: format version "
                       rf"{agent_queues.QUEUE_VERSION + 1}, this agent knows version "
                       rf"{agent_queues.QUEUE_VERSION}"):  # fmt: skip
        AgentOutbound(path, KEY)
    _set_version(path, agent_queues.QUEUE_VERSION)
    assert AgentOutbound(path, KEY).last_seq() == 1


def test_the_agent_refuses_an_inbound_queue_of_another_version_at_once(tmp_path: Path) -> None:
    """A running agent adopted by a daemon that writes its inbound queue in another format
    stops with the reason instead of answering rows it misreads (no retries: a version does not
    change by waiting)."""
    writer = queues.InboundWriter(tmp_path, KEY, os.getgid())
    writer.append("hello", 1.0, None)
    writer.close()
    path = tmp_path / queues.INBOUND_FILE
    _set_version(path, agent_queues.QUEUE_VERSION + 1)
    inbound = agent_queues.Inbound(path, KEY)
    with pytest.raises(agent_queues.QueueError, match=rf"refusing {path}: format version "):
        inbound.read_after(0, 1)
    _set_version(path, agent_queues.QUEUE_VERSION)
    assert inbound.read_after(0, 1) == [(1, "hello")]
    inbound.close()


def test_the_daemon_and_the_agent_agree_on_the_inbound_version() -> None:
    assert queues.QUEUE_VERSION == agent_queues.QUEUE_VERSION


def test_a_start_cache_another_build_wrote_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What another ironclawd learnt about the same unchanged runsc or agent image came from
    its parsing, hashing and platform trials: after an upgrade or a downgrade it is learnt
    again, not taken."""
    path = tmp_path / "cache" / "start.json"
    path.parent.mkdir(mode=0o700)
    # As the version before builds were recorded wrote it.
    path.write_text(
        json.dumps({"version": 1, "entries": {"runsc-detect": {"key": "runsc", "value": "old"}}})
    )
    assert IdentityCache(path).get("runsc-detect", "runsc") is None
    monkeypatch.setattr(filecache, "_build", lambda: "0.1.0\0another install")
    IdentityCache(path).put("runsc-detect", "runsc", "older")
    monkeypatch.undo()
    assert IdentityCache(path).get("runsc-detect", "runsc") is None
    IdentityCache(path).put("runsc-detect", "runsc", "this build's")
    assert IdentityCache(path).get("runsc-detect", "runsc") == "this build's"


def test_a_session_key_wrapped_in_another_format_is_refused_naming_both_versions() -> None:
    master = MasterKey(bytes(32), "test")
    wrapped = master.wrap("abcd1234", bytes(range(32)))
    assert master.unwrap("abcd1234", wrapped) == bytes(range(32))
    newer = bytes([wrapped[0] + 1]) + wrapped[1:]
    with pytest.raises(HostError, match=r"session abcd1234: wrapped key of format version 2, "
                       r"this ironclawd knows version 1"):  # fmt: skip
        master.unwrap("abcd1234", newer)
