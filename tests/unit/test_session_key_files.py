"""Where an unwrapped session key lives (store/keys.py): a 0400 file of the agent's uid in the
keys directory, which alone keeps a host account that happens to have that uid away from every
session's key (tests/redteam/test_agent_uid_host_user_s50.py). The directory is the daemon's own
0700 one whoever made it, and a key is wiped before it is unlinked."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ironclawd.errors import HostError
from ironclawd.store import keys
from ironclawd.store.keys import remove_tmpfs_key, write_tmpfs_key, write_tmpfs_placeholder

SID = "abcdefgh1234"
KEY = bytes(range(32))
UID, GID = os.getuid(), os.getgid()


@pytest.fixture(autouse=True)
def any_directory_is_a_tmpfs(monkeypatch: pytest.MonkeyPatch) -> None:
    """That check is keys.py's own (mountinfo); here the test's directory stands for /run."""
    monkeypatch.setattr(keys, "_on_tmpfs", lambda directory: True)


@pytest.fixture
def no_umask() -> Iterator[None]:
    """The daemon runs with UMask=0077, which hid the mode its code asked for."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.usefixtures("no_umask")
@pytest.mark.parametrize("write", [
    lambda path: write_tmpfs_key(path, KEY, UID, GID),
    lambda path: write_tmpfs_placeholder(path, UID, GID),
])  # fmt: skip
def test_the_keys_directory_is_made_0700(tmp_path: Path, write: Callable[[Path], None]) -> None:
    """Before, 0711: anyone could pass through to a key file named by its session id."""
    directory = tmp_path / "keys"
    write(directory / SID)
    assert _mode(directory) == 0o700


def test_a_keys_directory_others_may_enter_is_closed_before_a_key_goes_in(tmp_path: Path) -> None:
    """One made wider by anything but the daemon (tmpfiles sets 0700 only at boot) was used as
    it was: each key, a 0400 file of the agent's uid, was then readable by a host account with
    that uid."""
    directory = tmp_path / "keys"
    directory.mkdir()
    directory.chmod(0o755)
    write_tmpfs_key(directory / SID, KEY, UID, GID)
    assert _mode(directory) == 0o700
    assert (directory / SID).read_bytes() == KEY.hex().encode()
    assert _mode(directory / SID) == 0o400


def test_a_keys_directory_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    (tmp_path / "keys").symlink_to(real)
    with pytest.raises(HostError, match="not a directory of its own"):
        write_tmpfs_key(tmp_path / "keys" / SID, KEY, UID, GID)
    assert list(real.iterdir()) == []


def test_a_removed_key_is_wiped_then_unlinked(tmp_path: Path) -> None:
    path = tmp_path / "keys" / SID
    write_tmpfs_key(path, KEY, UID, GID)
    os.chmod(path, 0o600)  # the test's own uid holds it open for writing below, not root
    seen = os.open(path, os.O_RDONLY)  # the inode as a mount of it would keep it
    try:
        remove_tmpfs_key(path)
        assert not path.exists()
        assert os.pread(seen, 128, 0) == bytes(64)
    finally:
        os.close(seen)
