"""No driver exception leaves the store: every StateStore and inbound-queue method turns a
SQLCipher or file-system error into the error tree (DiskFull, else HostError) naming the
operation and the file, and leaves no transaction open; an unreadable credential is a
ConfigError naming the credential and the file, never an OSError or UnicodeDecodeError."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ironclawd.domain.changes import Change
from ironclawd.domain.messages import GENESIS, Reply
from ironclawd.domain.reply_bounds import ReplyUsage
from ironclawd.domain.session import Session, State
from ironclawd.errors import ConfigError, DiskFull, HostError, NotFound
from ironclawd.store.credentials import CredentialStore
from ironclawd.store.queues import InboundWriter
from ironclawd.store.state import StateStore

KEY = bytes(range(32))
SESSION = Session("abcd1234", "demo", State.CREATING, 1.0, 1.0, 1.0)
CHANGE = Change("chg-1", "persona", "demo", "{}", "why", "uid:0(root)", "{}", "{}", "h", 1.0, 2.0)
REPLY = Reply(1, 1, 1.0, "hi", GENESIS)


def _shared(store: StateStore) -> Any:
    """What store/channel_state.py does with the connection it shares."""
    with store.shared("reading channel rows") as db:
        return db.execute("SELECT 1").fetchone()


# One call per public StateStore method: a new method must be added here (the test checks).
CALLS: dict[str, Callable[[StateStore], Any]] = {
    "insert": lambda s: s.insert(SESSION),
    "save": lambda s: s.save(SESSION),
    "get": lambda s: s.get("abcd1234"),
    "list_sessions": lambda s: s.list_sessions(),
    "delete": lambda s: s.delete("abcd1234"),
    "put_wrapped_key": lambda s: s.put_wrapped_key("abcd1234", b"k"),
    "wrapped_key": lambda s: s.wrapped_key("abcd1234"),
    "destroy_session_data": lambda s: s.destroy_session_data("abcd1234"),
    "add_replies": lambda s: s.add_replies("abcd1234", [REPLY], ReplyUsage(169, 1, 1)),
    "reply_usage": lambda s: s.reply_usage("abcd1234"),
    "last_reply": lambda s: s.last_reply("abcd1234"),
    "replies_after": lambda s: s.replies_after("abcd1234", 0),
    "set_pruned": lambda s: s.set_pruned("abcd1234", 1),
    "pruned": lambda s: s.pruned("abcd1234"),
    "add_sender": lambda s: s.add_sender("abcd1234", "uid:1000(alice)"),
    "senders": lambda s: s.senders("abcd1234"),
    "put_agent": lambda s: s.put_agent("demo", "{}", 1.0),
    "agents": lambda s: s.agents(),
    "insert_change": lambda s: s.insert_change(CHANGE),
    "save_change": lambda s: s.save_change(CHANGE),
    "get_change": lambda s: s.get_change("chg-1"),
    "list_changes": lambda s: s.list_changes(),
    "list_changes_page": lambda s: s.list_changes_page(None, "", 10, 1024),
    "count_changes_since": lambda s: s.count_changes_since("uid:0(root)", 0.0),
    "set_audit_head": lambda s: s.set_audit_head(1, "mac"),
    "audit_head": lambda s: s.audit_head(),
    "shared": _shared,
}
CLOSE_IS_IDEMPOTENT = "close"  # closing a closed connection is a no-op in the driver


def test_the_calls_cover_every_public_state_store_method() -> None:
    public = {n for n, _ in inspect.getmembers(StateStore, inspect.isfunction) if n[0] != "_"}
    assert public == set(CALLS) | {CLOSE_IS_IDEMPOTENT}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_state_store_method_translates_a_driver_error_naming_itself(
    tmp_path: Path, name: str
) -> None:
    store = StateStore(tmp_path / "state.db", KEY)
    store._db.close()  # every statement now fails in the driver (ProgrammingError)
    with pytest.raises(HostError, match=rf" in state DB {tmp_path}/state\.db: ") as caught:
        CALLS[name](store)
    assert type(caught.value) is HostError
    assert caught.value.__cause__ is not None
    store.close()


def test_a_failed_write_is_a_host_error_and_leaves_no_transaction_open(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db", KEY)
    store.add_replies("abcd1234", [REPLY])
    store._db.execute("PRAGMA query_only = ON")
    with pytest.raises(HostError, match="destroying the data of session abcd1234 in state DB "):
        store.destroy_session_data("abcd1234")  # BEGIN, then a DELETE the driver refuses
    assert not store._db.in_transaction
    store._db.execute("PRAGMA query_only = OFF")
    store.destroy_session_data("abcd1234")
    assert store.last_reply("abcd1234") == (0, GENESIS)
    store.close()


def test_opening_a_state_db_that_is_not_one_names_it(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"not a database, not encrypted either" * 200)
    with pytest.raises(HostError, match=rf"opening state DB {path}: "):
        StateStore(path, KEY)
    (tmp_path / "file").write_text("")
    with pytest.raises(HostError, match=rf"opening state DB {tmp_path}/file/state\.db: "):
        StateStore(tmp_path / "file" / "state.db", KEY)  # its directory is a file


def _writer(tmp_path: Path) -> InboundWriter:
    return InboundWriter(tmp_path, KEY, os.getgid())


def test_inbound_queue_errors_name_the_operation_and_the_file(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    assert writer.append("one", 1.0, "c1") == (1, True)
    writer._db.execute("PRAGMA query_only = ON")
    with pytest.raises(HostError, match=rf"appending to {tmp_path}/inbound\.db: ") as caught:
        writer.append("two", 2.0, "c2")
    assert type(caught.value) is HostError
    writer._db.execute("PRAGMA query_only = OFF")
    assert writer.append("two", 2.0, "c2") == (2, True)
    writer._db.close()
    with pytest.raises(HostError, match=rf"reading the last seq of {tmp_path}/inbound\.db: "):
        writer.last_seq()
    writer.close()


def test_a_full_inbound_queue_is_disk_full(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    pages = writer._db.execute("PRAGMA page_count").fetchone()[0]
    writer._db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(DiskFull, match=rf"appending to {tmp_path}/inbound\.db: .*nothing was"):
        writer.append("x" * 20000, 1.0, None)
    writer._db.execute("PRAGMA max_page_count = 1000000")
    assert writer.append("x", 1.0, None) == (1, True)
    writer.close()


@pytest.fixture
def credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CredentialStore:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    return CredentialStore(tmp_path)


def test_a_credential_that_is_not_utf8_names_itself_and_not_its_bytes(
    tmp_path: Path, credentials: CredentialStore
) -> None:
    (tmp_path / "openai").write_bytes(b"sk-\xff\xfe-secret")
    (tmp_path / "openai").chmod(0o600)
    with pytest.raises(ConfigError) as caught:
        credentials.get("openai")
    message = str(caught.value)
    assert message == (
        f"reading credential 'openai' from {tmp_path}/openai: not UTF-8 text (at byte 3); "
        "write it as UTF-8"
    )
    assert caught.value.__cause__ is None  # the decode error would quote the bytes


def test_a_fifo_is_refused_without_waiting_for_a_writer(
    tmp_path: Path, credentials: CredentialStore
) -> None:
    # Opened without O_NONBLOCK, it blocked the caller (the event loop) until a writer came.
    os.mkfifo(tmp_path / "openai", 0o600)
    with pytest.raises(ConfigError, match="not a regular file"):
        credentials.get("openai")


def test_the_daemons_own_key_in_any_form_is_never_a_credential(
    tmp_path: Path, credentials: CredentialStore
) -> None:
    # docs/operations.md has operators keep the encrypted master key here: a rule naming it
    # would have sent it upstream.
    for name in ("master.key", "master.key.cred"):
        (tmp_path / name).write_text("sealed key\n")
        (tmp_path / name).chmod(0o600)
        with pytest.raises(ConfigError, match=r"master\.key\*"):
            credentials.get(name)


def test_a_credential_that_cannot_be_read_names_itself_and_the_file(
    tmp_path: Path, credentials: CredentialStore
) -> None:
    (tmp_path / "anthropic").mkdir(mode=0o700)  # open() works, read() is EISDIR
    with pytest.raises(ConfigError, match=rf"reading credential 'anthropic' from {tmp_path}/an"):
        credentials.get("anthropic")
    (tmp_path / "target").write_text("v")
    (tmp_path / "linked").symlink_to(tmp_path / "target")  # O_NOFOLLOW: ELOOP
    with pytest.raises(ConfigError, match=rf"'linked' from {tmp_path}/linked: "):
        credentials.get("linked")
    with pytest.raises(NotFound):
        credentials.get("absent")
