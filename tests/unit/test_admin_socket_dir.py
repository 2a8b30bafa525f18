"""The admin socket's directory must let the admin group's members through (0755). The daemon
made whatever directory ``admin.socket`` named 0755, also one that was there already:
``admin.socket = "/root/ic.sock"`` opened /root to every user (found by a review, stop 50).
A directory it makes is still 0755; one that was there is never widened: it is refused unless
others may pass through it already."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ironclawd.api.sockets import ensure_shared_dir
from ironclawd.errors import HostError


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def base(tmp_path: Path) -> Path:
    if os.geteuid() != 0 or os.lstat(tmp_path).st_uid != 0:
        pytest.fail("needs root and a root-owned tmp dir (the checks want root's directories)")
    tmp_path.chmod(0o755)
    return tmp_path


def test_a_closed_directory_that_was_there_is_refused_and_left_closed(base: Path) -> None:
    home = base / "home-of-root"
    home.mkdir(0o700)
    home.chmod(0o700)
    with pytest.raises(HostError, match=r"mode 0700.*does not widen a directory it did not make"):
        ensure_shared_dir(home, 0o755)
    assert mode(home) == 0o700  # before: 0755


def test_a_missing_directory_is_made_0755(base: Path) -> None:
    ensure_shared_dir(base / "run", 0o755)
    assert mode(base / "run") == 0o755


def test_a_passable_directory_that_was_there_is_taken_as_it_is(base: Path) -> None:
    srv = base / "srv"
    srv.mkdir()
    srv.chmod(0o711)
    ensure_shared_dir(srv, 0o755)
    assert mode(srv) == 0o711


def test_a_directory_only_the_admin_group_may_pass_through_is_taken_as_it_is(base: Path) -> None:
    """0750 (or 0710) root:<admin group> lets exactly the admin group's members reach the
    socket: tighter than 0755, not a reason to refuse to start. (The group here is root's, gid
    0: unit tests do not chown.)"""
    run = base / "run"
    run.mkdir()
    run.chmod(0o750)
    assert os.lstat(run).st_gid == 0
    ensure_shared_dir(run, 0o755, gid=0)
    assert mode(run) == 0o750
    with pytest.raises(HostError, match="mode 0750"):  # another group's members pass: not ours
        ensure_shared_dir(run, 0o755, gid=4242)
