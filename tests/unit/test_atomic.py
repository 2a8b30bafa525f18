"""ironclawd/atomic.py: the one way files are written whole or not at all."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ironclawd.atomic import atomic_write


def test_writes_whole_with_its_mode_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "f"
    assert atomic_write(target, b"one", mode=0o640)
    assert target.read_bytes() == b"one"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert atomic_write(target, b"two" * 100_000)
    assert target.read_bytes() == b"two" * 100_000
    assert os.listdir(tmp_path) == ["f"]  # no temp file left behind


def test_without_replace_an_existing_file_wins(tmp_path: Path) -> None:
    target = tmp_path / "key"
    target.write_bytes(b"theirs")
    assert not atomic_write(target, b"ours", replace=False)
    assert target.read_bytes() == b"theirs"
    assert atomic_write(tmp_path / "new", b"ours", replace=False)
    assert (tmp_path / "new").read_bytes() == b"ours"
    assert sorted(os.listdir(tmp_path)) == ["key", "new"]


def test_relative_to_an_open_directory(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert atomic_write("config.json", b"{}", dir_fd=fd)
    finally:
        os.close(fd)
    assert (tmp_path / "config.json").read_bytes() == b"{}"


def test_a_failed_write_keeps_the_old_file_and_removes_the_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f"]


def test_a_symlink_in_place_of_the_target_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / "f").symlink_to(victim)
    assert atomic_write(tmp_path / "f", b"new")
    assert victim.read_bytes() == b"keep"
    assert not (tmp_path / "f").is_symlink()
    assert (tmp_path / "f").read_bytes() == b"new"
