"""A webhook channel's ``listen`` may not take a socket the daemon or another channel holds: the
listener replaces whatever socket is at its path when it starts (host/webhook.py), and channels
start after the admin API, so ``listen = "unix:/run/ironclaw/admin.sock"`` took the admin
socket's path and left ironctl talking to a webhook server (found by a review)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ironclawd.config import parse_config
from ironclawd.errors import ConfigError


def _hook(name: str, listen: str, credential: str | None = None) -> str:
    return (
        f'[[channels]]\nname = "{name}"\ntype = "webhook"\nlisten = "{listen}"\n'
        f'endpoints = [{{name = "e", secret_credential = "{credential or name}-key"}}]\n'
    )


@pytest.mark.parametrize(
    ("prefix", "path", "why"),
    [
        ("", "/run/ironclaw/admin.sock", "admin socket"),
        ("[admin]\nsocket = '/run/ic/ctl.sock'\n", "/run/ic/ctl.sock", "admin socket"),
        ("", "/run/ironclaw/internal/admin-grpc.sock", "/run/ironclaw/internal"),
        ("[admin]\nsocket = '/run/ic/ctl.sock'\n", "/run/ic/internal/x.sock", "/run/ic/internal"),
        ("", "/run/ironclaw/sessions/abcdefgh0001/control.sock", "/run/ironclaw/sessions"),
        ("", "/var/lib/ironclaw/hooks.sock", "/var/lib/ironclaw"),
        ("[daemon]\nstate_dir = '/srv/ic'\n", "/srv/ic/x/hooks.sock", "/srv/ic"),
    ],
)
def test_a_listen_socket_on_a_daemon_path_is_refused(prefix: str, path: str, why: str) -> None:
    with pytest.raises(ConfigError, match=r"channels\.hooks\.listen") as caught:
        parse_config(prefix + _hook("hooks", f"unix:{path}"), "t.toml")
    assert why in str(caught.value)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("unix:/run/ironclaw/hooks.sock", "unix:/run/ironclaw/hooks.sock"),
        ("127.0.0.1:8787", "127.0.0.1:8787"),
        ("0.0.0.0:8787", "127.0.0.1:8787"),
        ("127.0.0.1:8787", "[::]:8787"),
        ("[::1]:8787", "[0:0::1]:8787"),
    ],
)
def test_two_channels_on_one_listen_address_are_refused(first: str, second: str) -> None:
    text = _hook("first", first) + _hook("second", second)
    with pytest.raises(ConfigError, match=r"channels\.second\.listen.*channel 'first'"):
        parse_config(text, "t.toml")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("unix:/run/ironclaw/a.sock", "unix:/run/ironclaw/b.sock"),
        ("127.0.0.1:8787", "127.0.0.1:8788"),
        ("127.0.0.1:8787", "127.0.0.2:8787"),
        ("127.0.0.1:8787", "unix:/run/ironclaw/hooks.sock"),
    ],
)
def test_distinct_listen_addresses_are_accepted(first: str, second: str) -> None:
    config = parse_config(_hook("first", first) + _hook("second", second), "t.toml")
    assert [c.listen for c in config.channels] == [first, second]


def test_a_listen_socket_reached_through_a_symlinked_directory_is_refused(
    tmp_path: Path,
) -> None:
    # /var/run is /run on Debian: "unix:/var/run/ironclaw/admin.sock" passed the comparison of
    # spellings, and the listener (its lstat and unlink follow the directory's symlink) took
    # the admin socket's place all the same; so did a second channel on the other spelling.
    (tmp_path / "run").mkdir()
    (tmp_path / "alias").symlink_to("run")
    (tmp_path / "state").mkdir()
    (tmp_path / "state-alias").symlink_to("state")
    admin = f"[admin]\nsocket = '{tmp_path}/run/ctl.sock'\n"
    state = f"[daemon]\nstate_dir = '{tmp_path}/state'\n"
    cases = [
        (admin + _hook("hooks", f"unix:{tmp_path}/alias/ctl.sock"), "hooks", "admin socket"),
        (admin + _hook("hooks", f"unix:{tmp_path}/alias/internal/x.sock"), "hooks", "internal"),
        (state + _hook("hooks", f"unix:{tmp_path}/state-alias/h.sock"), "hooks", "state"),
        (_hook("first", f"unix:{tmp_path}/run/h.sock")
         + _hook("second", f"unix:{tmp_path}/alias/h.sock"), "second", "channel 'first'"),
    ]  # fmt: skip
    for text, channel, why in cases:
        with pytest.raises(ConfigError, match=rf"channels\.{channel}\.listen") as caught:
            parse_config(text, "t.toml")
        assert why in str(caught.value), text


# What Linux answers when both bind, the first listening (SO_REUSEADDR as host/webhook.py sets
# it, net.ipv6.bindv6only=0 as Debian has it): an IPv4-mapped address is its IPv4 address, a
# wildcard takes every address of its family on the port, [::] those of both families.
@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("127.0.0.1:8787", "[::ffff:127.0.0.1]:8787"),
        ("[::ffff:127.0.0.1]:8787", "127.0.0.1:8787"),
        ("[::ffff:7f00:1]:8787", "[::ffff:127.0.0.1]:8787"),
        ("0.0.0.0:8787", "[::ffff:127.0.0.1]:8787"),
        ("[::ffff:0.0.0.0]:8787", "127.0.0.2:8787"),
        ("[::ffff:0.0.0.0]:8787", "0.0.0.0:8787"),
        ("[::]:8787", "0.0.0.0:8787"),
        ("[::]:8787", "[::1]:8787"),
        ("[::1]:8787", "[::]:8787"),
        ("[::]:8787", "[::ffff:0.0.0.0]:8787"),
    ],
)
def test_two_channels_that_would_clash_at_bind_are_refused(first: str, second: str) -> None:
    text = _hook("first", first) + _hook("second", second)
    with pytest.raises(ConfigError, match=r"channels\.second\.listen") as caught:
        parse_config(text, "t.toml")
    assert f"channel 'first' listens on {first!r}" in str(caught.value)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("0.0.0.0:8787", "[::1]:8787"),
        ("[::ffff:0.0.0.0]:8787", "[::1]:8787"),
        ("[::ffff:127.0.0.1]:8787", "[::1]:8787"),
        ("[::ffff:127.0.0.1]:8787", "127.0.0.2:8787"),
        ("[::ffff:127.0.0.1]:8787", "[::ffff:127.0.0.2]:8787"),
        ("[::ffff:127.0.0.1]:8787", "127.0.0.1:8788"),
        ("[::]:8787", "0.0.0.0:8788"),
    ],
)
def test_two_channels_that_bind_side_by_side_are_accepted(first: str, second: str) -> None:
    config = parse_config(_hook("first", first) + _hook("second", second), "t.toml")
    assert [c.listen for c in config.channels] == [first, second]
