"""Every default the reference shows (docs/config.md, ironclawd.toml(5)) can be written in the
file: ``agents.NAME.base_url = ""`` and ``credential = ""``, the documented defaults, were
refused as bad values, and ``egress.ca_file``'s expected text left out the "" it takes (found
by a review)."""

from __future__ import annotations

import pytest

from ironclawd.config import SCHEMA, parse_config
from ironclawd.docgen.configref import toml_defaults
from ironclawd.errors import ConfigError

DEFAULTS = {
    key: value
    for key, value in toml_defaults().items()
    if not key.startswith("channels[]") and not value.endswith('..."')  # cut for the page
}


@pytest.mark.parametrize(("key", "value"), sorted(DEFAULTS.items()))
def test_each_documented_default_can_be_written(key: str, value: str) -> None:
    table, _, name = key.rpartition(".")
    header = "[agents.x]" if table == "agents.NAME" else f"[{table}]"
    parse_config(f"{header}\n{name} = {value}\n", "t.toml")


def test_the_expected_text_of_ca_file_names_the_empty_default() -> None:
    _, keys = SCHEMA["egress"]
    with pytest.raises(ConfigError, match=r"expected '' \("):
        parse_config("[egress]\nca_file = 5\n", "t.toml")
    assert keys["ca_file"].convert("") == ""
