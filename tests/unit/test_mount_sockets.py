"""Sandboxes run with runsc's ``--host-uds=open`` (the agent reaches its own control socket that
way), which lets a box connect to any host socket on any of its mounts whose mode lets its uid
write it, a read-only grant included. A granted directory holding a service's socket was
accepted at submission and at every start (found by a review): now refused, and the places
where services keep their sockets are never granted."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from ironclawd.bundle.grants import grant_refusal
from ironclawd.domain.policy import Mount
from ironclawd.errors import PolicyDenied
from ironclawd.host.mounts import find_socket, resolve_mount_source

SID = "a1b2c3d4e5f6"


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    root = tmp_path / "srv"
    (root / "project" / "src" / "deep").mkdir(parents=True)
    (root / "project" / "README").write_text("hello\n")
    return root


@pytest.fixture
def listening() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for sock in held:
        sock.close()


def _listen(path: Path, held: list[socket.socket]) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.chmod(path, 0o666)
    server.listen(1)
    held.append(server)


def test_a_directory_holding_a_socket_anywhere_below_it_is_not_granted(
    allowed: Path, listening: list[socket.socket]
) -> None:
    grant = allowed / "project"
    assert resolve_mount_source(str(grant), [str(allowed)]) == str(grant)
    _listen(grant / "src" / "deep" / "service.sock", listening)
    with pytest.raises(PolicyDenied, match=r"holds the Unix socket .*/deep/service\.sock"):
        resolve_mount_source(str(grant), [str(allowed)])


def test_a_symlink_to_a_socket_elsewhere_is_not_a_socket_in_the_grant(
    allowed: Path, tmp_path: Path, listening: list[socket.socket]
) -> None:
    # Inside the sandbox a symlink resolves in the sandbox's own view, never the host's.
    _listen(tmp_path / "elsewhere.sock", listening)
    (allowed / "project" / "link.sock").symlink_to(tmp_path / "elsewhere.sock")
    assert find_socket(str(allowed / "project")) is None


def test_a_tree_too_large_to_check_is_refused_naming_the_limit(allowed: Path) -> None:
    for n in range(5):
        (allowed / "project" / f"f{n}").write_text("")
    with pytest.raises(PolicyDenied, match="more than 4 entries"):
        find_socket(str(allowed / "project"), limit=4)
    assert find_socket(str(allowed / "project"), limit=100) is None


@pytest.mark.parametrize("source", ["/run/dbus", "/var/run/systemd", "/run"])
def test_where_services_keep_their_sockets_is_never_granted(source: str) -> None:
    refusal = grant_refusal(Mount("/mnt/x", source, read_only=True), SID, Path("/var/lib/x"))
    assert refusal is not None
    assert "never granted" in refusal[1]
