"""Paths of the config that passed --check-config and then failed the start, or weakened what
they share a directory with (found by a review):

- an ``admin.socket`` longer than a Unix socket address holds failed at start with "binding
  PATH: None";
- the admin socket's directory is made 0755 (api/server.py), so ``admin.socket`` in the state
  directory or in the credentials directory opened that 0700 directory to every user;
- ``master_key_file`` inside ``state_dir`` put the key beside the data it encrypts (docs: "kept
  apart from the data it protects"), and ``state_dir = "/"`` spread the state over the root.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ironclawd.config import parse_config
from ironclawd.errors import ConfigError


def test_an_admin_socket_too_long_for_a_unix_address_is_refused() -> None:
    long = "/run/" + "d" * 100 + "/admin.sock"
    with pytest.raises(ConfigError, match=r"'admin\.socket': expected .*at most 107 bytes"):
        parse_config(f"[admin]\nsocket = '{long}'\n", "t.toml")


def test_an_admin_socket_whose_internal_socket_is_too_long_is_refused() -> None:
    # 101 bytes itself, but its directory's internal/admin-grpc.sock takes 115.
    path = "/run/" + "d" * 85 + "/admin.sock"
    assert len(path) == 101
    with pytest.raises(ConfigError, match=r"'admin\.socket': expected .*internal/admin-grpc"):
        parse_config(f"[admin]\nsocket = '{path}'\n", "t.toml")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[admin]\nsocket = '/var/lib/ironclaw/admin.sock'\n", "state_dir"),
        ("[admin]\nsocket = '/var/lib/ironclaw/run/admin.sock'\n", "state_dir"),
        ("[daemon]\nstate_dir = '/srv/ic'\n[admin]\nsocket = '/srv/ic/admin.sock'\n", "state_dir"),
        ("[admin]\nsocket = '/etc/ironclaw/credentials/admin.sock'\n", "master_key_file"),
        ("[admin]\nsocket = '/admin.sock'\n", "'/'"),
    ],
)
def test_an_admin_socket_in_a_directory_it_would_open_is_refused(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=r"'admin\.socket': expected .*0755") as caught:
        parse_config(text, "t.toml")
    assert why in str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        "[daemon]\nmaster_key_file = '/var/lib/ironclaw/master.key'\n",
        "[daemon]\nstate_dir = '/srv/ic'\nmaster_key_file = '/srv/ic/keys/master.key'\n",
        "[daemon]\nstate_dir = '/srv/ic/'\nmaster_key_file = '/srv//ic/master.key'\n",
    ],
)
def test_a_master_key_inside_the_state_directory_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match=r"'daemon\.master_key_file': expected .*state_dir"):
        parse_config(text, "t.toml")


def test_the_root_directory_as_state_dir_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"'daemon\.state_dir': expected .*other than '/'"):
        parse_config("[daemon]\nstate_dir = '/'\nmaster_key_file = '/etc/ic/master.key'\n", "t")


def test_paths_of_their_own_are_taken() -> None:
    config = parse_config(
        "[daemon]\nstate_dir = '/srv/ic'\nmaster_key_file = '/etc/ic/keys/master.key'\n"
        "[admin]\nsocket = '/run/ic/admin.sock'\n",
        "t.toml",
    )
    assert str(config.admin.socket) == "/run/ic/admin.sock"
    assert str(config.daemon.master_key_file) == "/etc/ic/keys/master.key"


@pytest.mark.parametrize(
    ("socket", "key_file", "why"),
    [
        # The daemon's root-only directories: each stays 0700 (or 0711), and one the admin
        # socket lies in was made 0755 for the daemon's life (api/server.py).
        ("/run/ironclaw/internal/admin.sock", "", "/run/ironclaw/internal"),
        ("/run/ironclaw/keys/admin.sock", "", "/run/ironclaw/keys"),
        ("/run/ironclaw/ingest/admin.sock", "", "/run/ironclaw/ingest"),
        ("/run/ironclaw/mntns/admin.sock", "", "/run/ironclaw/mntns"),
        ("/run/ironclaw/sessions/admin.sock", "", "/run/ironclaw/sessions"),
        ("/var/cache/ironclaw/admin.sock", "", "/var/cache/ironclaw"),
        # The host credentials stay in /etc/ironclaw/credentials when the master key moves.
        ("/etc/ironclaw/credentials/admin.sock", "/srv/keys/master.key", "credentials"),
    ],
)
def test_an_admin_socket_in_a_closed_directory_of_the_daemon_is_refused(
    socket: str, key_file: str, why: str
) -> None:
    key = f"[daemon]\nmaster_key_file = '{key_file}'\n" if key_file else ""
    with pytest.raises(ConfigError, match=r"'admin\.socket': expected .*0755") as caught:
        parse_config(f"{key}[admin]\nsocket = '{socket}'\n", "t.toml")
    assert why in str(caught.value)


def test_a_master_key_in_the_root_directory_refuses_no_admin_socket_outside_it() -> None:
    # Every directory lies in '/': the socket's own directory is what is opened, not '/'.
    config = parse_config("[daemon]\nmaster_key_file = '/master.key'\n", "t.toml")
    assert str(config.admin.socket) == "/run/ironclaw/admin.sock"


def test_an_admin_socket_reached_through_a_symlinked_directory_is_refused(
    tmp_path: Path,
) -> None:
    # /var/run is /run on Debian: "/var/run/ironclaw/internal/admin.sock" passed as a path of
    # its own and opened /run/ironclaw/internal all the same (the kernel follows the link).
    (tmp_path / "state").mkdir()
    (tmp_path / "alias").symlink_to("state")
    text = (f"[daemon]\nstate_dir = '{tmp_path}/state'\n"
            f"[admin]\nsocket = '{tmp_path}/alias/admin.sock'\n")  # fmt: skip
    with pytest.raises(ConfigError, match=r"'admin\.socket': expected .*state_dir"):
        parse_config(text, "t.toml")


def test_an_allowlist_reaching_a_moved_key_through_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "srv" / "keys").mkdir(parents=True)
    (tmp_path / "keys").symlink_to("srv/keys")
    text = (f"[daemon]\nmaster_key_file = '{tmp_path}/keys/master.key'\n"
            f"[gateway]\nmount_allowlist = ['{tmp_path}/srv']\n")  # fmt: skip
    with pytest.raises(ConfigError, match=r"'gateway\.mount_allowlist'"):
        parse_config(text, "t.toml")
