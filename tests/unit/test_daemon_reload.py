"""``systemctl reload ironclawd`` (SIGHUP) applies the log level, the agent log limits and
[pool]; every other change waits for a restart, and the journal says which. Only seven tables
were compared: a reload that changed [queues], [mcp] or a [daemon] key such as
``min_free_bytes`` said nothing, though ironclawd(8) promises a warning naming them (found by a
review of the docs, stop 50). And the running configuration became the file's whole, so a
second reload no longer named what still waited for a restart."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ironclawd import daemon
from ironclawd.config import parse_config

BASE = """
[daemon]
log_level = "info"
"""
CHANGED = """
[daemon]
log_level = "debug"
min_free_bytes = 1048576
agent_log_lines = 5

[queues]
max_rows = 500

[mcp]
tasks_max = 8
"""


def test_every_change_a_reload_does_not_apply_is_named() -> None:
    running, new = parse_config(BASE, "a.toml"), parse_config(CHANGED, "b.toml")
    assert daemon.restart_only(running, new) == ["daemon.min_free_bytes", "[queues]", "[mcp]"]
    assert daemon.restart_only(running, running) == []


def test_a_reload_warns_and_keeps_naming_what_waits_for_a_restart(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(daemon, "set_level", lambda level: None)
    d = daemon.Daemon(Path("a.toml"), parse_config(BASE, "a.toml"))
    caplog.set_level(logging.WARNING, logger="ironclawd")
    for _ in range(2):
        d._apply(parse_config(CHANGED, "b.toml"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        warnings
        == [
            "reload: daemon.min_free_bytes, [queues], [mcp]: changes take effect on restart, "
            "not on reload"
        ]
        * 2
    )
    running = d._config
    assert running.daemon.log_level == "debug"  # live
    assert running.daemon.agent_log_lines == 5  # live
    assert running.daemon.min_free_bytes == parse_config(BASE, "a.toml").daemon.min_free_bytes
    assert running.queues == parse_config(BASE, "a.toml").queues
    assert running.source == "b.toml"
