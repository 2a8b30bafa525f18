"""ironclawd's command line: started as systemd starts it (no argument), the daemon builds no
parser (argparse and gettext, ~2 ms of every start; tests/integration/test_daemon_imports.py
checks that they stay unloaded), and the values it then uses are the parser's own defaults."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from ironclawd import daemon


def test_no_argument_means_the_parsers_defaults() -> None:
    assert asdict(daemon._parse_args([])) == vars(daemon.build_parser().parse_args([]))


def test_arguments_are_parsed() -> None:
    options = daemon._parse_args(["--config", "/etc/x.toml", "--check-config"])
    assert options == daemon.Options(config=Path("/etc/x.toml"), check_config=True)
    with pytest.raises(SystemExit):
        daemon._parse_args(["--no-such-option"])
