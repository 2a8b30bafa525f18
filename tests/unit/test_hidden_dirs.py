"""Package-step units and MCP server units cannot see the daemon's own directories
(``InaccessiblePaths=``), whatever their modes. Only the default places were hidden: a
``state_dir`` moved by the config (its state DB, audit log, bundles, the agents' images) and a
moved master key stayed visible to both, kept from them by their modes alone (left as a note
by the review of stop 48; closed stop 50)."""

from __future__ import annotations

from pathlib import Path

from ironclawd.config import parse_config
from ironclawd.host.mcp import unit_properties
from ironclawd.host.pkg_runner import HelperLimits, helper_properties
from ironclawd.wiring import hidden_from_helpers

MOVED = """
[daemon]
state_dir = "/srv/ironclaw/state"
master_key_file = "/srv/keys/master.key"
"""


def test_a_moved_state_dir_and_master_key_are_hidden_with_the_mount_sources() -> None:
    config = parse_config(MOVED, "test.toml")
    hidden = hidden_from_helpers(config)
    assert "/srv/ironclaw/state" in hidden
    assert "/srv/keys/master.key" in hidden
    assert "/srv/keys" not in hidden  # the key's directory may be one others need
    helper = helper_properties(HelperLimits(), network=False, hidden=hidden)
    assert "InaccessiblePaths=-/srv/ironclaw/state" in helper
    mcp = unit_properties(config.mcp, (), None, hidden)
    assert "InaccessiblePaths=-/srv/ironclaw/state" in mcp
    assert "InaccessiblePaths=-/srv/keys/master.key" in mcp


def test_the_default_places_are_not_named_twice() -> None:
    config = parse_config("", "test.toml")
    assert hidden_from_helpers(config) == tuple(config.gateway.mount_allowlist)


def test_a_state_dir_below_a_default_private_dir_is_covered_by_it() -> None:
    config = parse_config('[daemon]\nstate_dir = "/var/lib/ironclaw/other"\n', "test.toml")
    assert hidden_from_helpers(config) == tuple(config.gateway.mount_allowlist)
    assert Path("/var/lib/ironclaw/other").is_relative_to("/var/lib/ironclaw")
