"""The master key's directory holds the host's credentials too (``CredentialStore`` reads the
key's directory). The sandbox spec refuses to grant the daemon's own places and ``state_dir``
whatever ``[gateway] mount_allowlist`` says, but a key the config moved out of /etc/ironclaw
was not among them: with the key in /srv/keys and /srv allowlisted, a mounts change could
grant /srv/keys to an agent (found by a review of the config, stop 50). Such an allowlist is
refused now, naming the key and the directory."""

from __future__ import annotations

import pytest

from ironclawd.config import parse_config
from ironclawd.errors import ConfigError


def config(allow: str, key: str = "/srv/keys/master.key") -> str:
    return f'[daemon]\nmaster_key_file = "{key}"\n[gateway]\nmount_allowlist = ["{allow}"]\n'


@pytest.mark.parametrize("allow", ["/srv", "/srv/keys", "/srv/keys/sub"])
def test_an_allowlist_over_or_inside_a_moved_key_directory_is_refused(allow: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(config(allow), "t.toml")
    message = str(refused.value)
    assert "'gateway.mount_allowlist'" in message
    assert "master key's (/srv/keys)" in message
    assert repr(allow) in message


def test_an_allowlist_beside_it_is_taken() -> None:
    parsed = parse_config(config("/srv/share"), "t.toml")
    assert parsed.gateway.mount_allowlist == ("/srv/share",)
    assert parse_config(config("/srv/keys2"), "t.toml").gateway.mount_allowlist == ("/srv/keys2",)


def test_the_default_key_place_is_left_to_the_sandbox_specs_own_check() -> None:
    # /etc holds /etc/ironclaw, which bundle/grants.py NEVER_GRANTED refuses at every start.
    parsed = parse_config('[gateway]\nmount_allowlist = ["/etc"]\n', "t.toml")
    assert parsed.gateway.mount_allowlist == ("/etc",)
