"""The master key's custody (store/keys.py): where it is read from, what is refused there, and
that a key already gone (zeroed at stop) or missing while data made under it remains is never
replaced by another one in silence."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ironclawd.errors import HostError
from ironclawd.store import keys
from ironclawd.store.keys import CREDENTIAL_NAME, MasterKey, load_master_key
from ironclawd.store.state import StateStore

KEY = bytes(range(32))
SID = "abcdefgh1234"


@pytest.fixture
def credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A systemd credentials directory the daemon is told of (its files are taken as they are:
    systemd made them)."""
    directory = tmp_path / "credentials"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(directory))
    return directory


@pytest.fixture
def fifo_with_a_key(credentials: Path) -> Iterator[Path]:
    """A FIFO where the key should be, with 32 bytes waiting in it and a writer holding it open
    (so that a reader that opens it blocking does not hang here, it reads those bytes)."""
    path = credentials / CREDENTIAL_NAME
    os.mkfifo(path, 0o600)
    writer = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    os.write(writer, KEY)
    try:
        yield path
    finally:
        os.close(writer)


def test_the_systemd_credential_is_read_when_the_unit_passes_one(credentials: Path) -> None:
    (credentials / CREDENTIAL_NAME).write_bytes(KEY)
    master = load_master_key(credentials / "elsewhere" / "master.key")
    assert master.source == f"credential {CREDENTIAL_NAME}"
    assert master.derive("x") == MasterKey(KEY, "test").derive("x")


def test_a_fifo_in_the_keys_place_is_refused_not_read(fifo_with_a_key: Path) -> None:
    """Before, the key was whatever a FIFO there gave (and with no writer, the daemon's start
    hung in open() until systemd killed it)."""
    with pytest.raises(HostError, match="not a regular file"):
        load_master_key(fifo_with_a_key.parent / "elsewhere" / "master.key")


def test_a_directory_in_the_keys_place_is_refused_as_such(credentials: Path) -> None:
    """Before, os.read's IsADirectoryError left the store untranslated (a traceback)."""
    (credentials / CREDENTIAL_NAME).mkdir()
    with pytest.raises(HostError, match="not a regular file"):
        load_master_key(credentials / "elsewhere" / "master.key")


def test_a_symlinked_key_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    real = tmp_path / "real.key"
    real.write_bytes(KEY)
    link = tmp_path / "credentials" / "master.key"
    link.parent.mkdir()
    link.symlink_to(real)
    with pytest.raises(HostError, match="reading master key"):
        load_master_key(link)


@pytest.mark.parametrize("made", ["state.db", "audit.log"])
def test_a_missing_key_is_not_made_anew_over_data_made_with_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, made: str
) -> None:
    """A key gone (its credential no longer passed after the plain file was shredded, as
    docs/operations.md has operators do; a restore that left it out) while the state DB or the
    audit log it keys is there: a new key opens none of it. Before, one was made in silence, a
    fresh plaintext key on disk, and the start failed later on "file is not a database"."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    state = tmp_path / "state"
    state.mkdir()
    (state / made).write_bytes(b"made under the old key")
    fallback = tmp_path / "credentials" / "master.key"
    with pytest.raises(HostError, match=f"missing, but {state / made} was made with it"):
        load_master_key(fallback, protects=(state / "state.db", state / "audit.log"))
    assert not fallback.exists()


def test_a_missing_key_is_made_when_nothing_was_made_with_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first start: the key is made (0600, random); the owner check that follows is
    root's, so a test run as another user sees that refusal, after the file was made."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    fallback = tmp_path / "credentials" / "master.key"
    protects = (tmp_path / "state.db", tmp_path / "audit.log")
    if os.geteuid() == 0:
        assert load_master_key(fallback, protects).source == str(fallback)
    else:
        with pytest.raises(HostError, match="must be owned by root"):
            load_master_key(fallback, protects)
    data = fallback.read_bytes()
    assert len(data) == keys.KEY_BYTES
    assert data != bytes(keys.KEY_BYTES)
    assert fallback.stat().st_mode & 0o777 == 0o600


def test_a_zeroed_master_key_is_never_used_as_a_key_of_zeros() -> None:
    """zero() at stop overwrites the key in place; a derive, wrap or unwrap after it used to
    run on 32 zero bytes: a session key wrapped so would open with a key anyone knows."""
    master = MasterKey(KEY, "test")
    wrapped = master.wrap(SID, bytes(32))
    master.zero()
    for call in (lambda: master.derive("ironclaw state db v1"),
                 lambda: master.wrap(SID, bytes(32)),
                 lambda: master.unwrap(SID, wrapped),
                 master.fingerprint):  # fmt: skip
        with pytest.raises(HostError, match="master key was zeroed"):
            call()


def test_a_wrapped_key_opens_only_for_its_own_session_and_whole(tmp_path: Path) -> None:
    """Someone who can write the state DB's rows but not read the master key (docs/
    threat-model.md §1): a wrapped key moved to another session's row, or any byte of it
    changed, does not open. Each wrap has a fresh nonce: two of one key differ."""
    master = MasterKey(KEY, "test")
    first, second = "aaaaaaaa1111", "bbbbbbbb2222"
    store = StateStore(tmp_path / "state.db", master.derive("ironclaw state db v1"))
    try:
        store.put_wrapped_key(first, master.wrap(first, bytes(range(32, 64))))
        store.put_wrapped_key(second, master.wrap(second, bytes(range(64, 96))))
        moved = store.wrapped_key(first)
        assert moved is not None
        store.put_wrapped_key(second, moved)  # the first session's key in the second's row
        with pytest.raises(HostError, match=f"session {second}: wrapped key does not open"):
            master.unwrap(second, moved)
    finally:
        store.close()
    assert master.unwrap(first, moved) == bytes(range(32, 64))
    for index in range(1, len(moved)):  # nonce, ciphertext and tag; the version byte below
        changed = bytearray(moved)
        changed[index] ^= 0x01
        with pytest.raises(HostError, match="does not open"):
            master.unwrap(first, bytes(changed))
    with pytest.raises(HostError, match="wrapped key of format version 2"):
        master.unwrap(first, b"\x02" + moved[1:])
    assert master.wrap(first, bytes(32)) != master.wrap(first, bytes(32))
