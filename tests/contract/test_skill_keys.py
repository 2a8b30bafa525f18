"""``TrustedKeys``: the fake and the real directory adapter (host/skill_keys.py) agree: every key
file placed is read, with its text, and one removed is gone at the next read. The real one also
reads only regular ``*.pub`` files (no symlinks, no other names, nothing oversized) and trusts
nothing when the directory is missing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ironclawd.host.skill_keys import MAX_KEY_FILE, TrustedKeyDir
from ironclawd.ports import TrustedKeys
from tests.fakes import FakeTrustedKeys
from tests.unit.skill_samples import KEY, STRANGER

Place = Callable[[str, str | None], None]  # name, text (None: remove)


@pytest.fixture(params=["fake", "real"])
def keys(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[TrustedKeys, Place]:
    if request.param == "fake":
        fake = FakeTrustedKeys()

        def place_fake(name: str, text: str | None) -> None:
            if text is None:
                del fake.keys[name]
            else:
                fake.keys[name] = text

        return fake, place_fake

    def place_real(name: str, text: str | None) -> None:
        if text is None:
            (tmp_path / name).unlink()
        else:
            (tmp_path / name).write_text(text)

    return TrustedKeyDir(tmp_path), place_real


def test_every_key_placed_is_read_and_a_removed_one_is_gone(
    keys: tuple[TrustedKeys, Place],
) -> None:
    port, place = keys
    assert dict(port.read()) == {}
    place("a.pub", KEY.public_key().to_file())
    place("b.pub", STRANGER.public_key().to_file())
    assert dict(port.read()) == {
        "a.pub": KEY.public_key().to_file(),
        "b.pub": STRANGER.public_key().to_file(),
    }
    place("b.pub", None)
    assert list(port.read()) == ["a.pub"]


def test_the_real_directory_reads_only_regular_pub_files(tmp_path: Path) -> None:
    assert TrustedKeyDir(tmp_path / "missing").read() == {}
    (tmp_path / "ok.pub").write_text(KEY.public_key().to_file())
    (tmp_path / "notes.txt").write_text(STRANGER.public_key().to_file())
    (tmp_path / ".hidden.pub").write_text(STRANGER.public_key().to_file())
    (tmp_path / "big.pub").write_text("x" * (MAX_KEY_FILE + 1))
    (tmp_path / "dir.pub").mkdir()
    outside = tmp_path.parent / f"{tmp_path.name}-outside.pub"
    outside.write_text(STRANGER.public_key().to_file())
    (tmp_path / "link.pub").symlink_to(outside)
    assert list(TrustedKeyDir(tmp_path).read()) == ["ok.pub"]


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_a_key_file_others_may_write_is_not_trusted(tmp_path: Path, mode: int) -> None:
    """As the daemon's config file (config.py): a key file someone besides its owner may write
    could be swapped for his own key, and skills he signs would pass as trusted. Before, any
    mode was read."""
    (tmp_path / "ok.pub").write_text(KEY.public_key().to_file())
    loose = tmp_path / "loose.pub"
    loose.write_text(STRANGER.public_key().to_file())
    loose.chmod(mode)
    assert list(TrustedKeyDir(tmp_path).read()) == ["ok.pub"]
