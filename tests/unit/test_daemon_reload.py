"""``systemctl reload ironclawd`` (SIGHUP) applies the log level, the agent log limits and
[pool]; every other change waits for a restart, and the journal says which. Only seven tables
were compared: a reload that changed [queues], [mcp] or a [daemon] key such as
``min_free_bytes`` said nothing, though ironclawd(8) promises a warning naming them (found by a
review of the docs, stop 50). And the running configuration became the file's whole, so a
second reload no longer named what still waited for a restart."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from ironclawd import config_reload, daemon
from ironclawd.config import parse_config
from ironclawd.domain.checks import CheckResult, Status
from ironclawd.services.doctor import Doctor
from tests.fakes.clock import FakeClock
from tests.fakes.host import FakeUnits
from tests.unit.test_doctor_platform import Probes

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
rows_per_read = 500

[mcp]
tasks_max = 8
"""


def test_every_change_a_reload_does_not_apply_is_named() -> None:
    running, new = parse_config(BASE, "a.toml"), parse_config(CHANGED, "b.toml")
    assert config_reload.restart_only(running, new) == [
        "daemon.min_free_bytes",
        "[queues]",
        "[mcp]",
    ]
    assert config_reload.restart_only(running, running) == []
    # The bounds of a session's replies are live: a session held at one is tried again.
    bounds = parse_config("[queues]\nmax_rows = 5\nmax_ingested_bytes = 2097152\n"
                          "max_replies_per_message = 2\n", "c.toml")  # fmt: skip
    assert config_reload.restart_only(running, bounds) == []


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


def _config_check(doctor: Doctor) -> CheckResult:
    return next(r for r in asyncio.run(doctor.run()) if r.name == "config.file")


def test_doctor_compares_the_file_with_what_runs_after_a_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """doctor kept the configuration of the start: after any reload, its config.file check
    warned "differs from the loaded config; systemctl reload" for good, and a change that only
    a restart applies was sent to a reload that cannot apply it."""
    monkeypatch.setattr(daemon, "set_level", lambda level: None)
    path = tmp_path / "ironclawd.toml"
    path.write_text(BASE)
    path.chmod(0o644)
    d = daemon.Daemon(path, parse_config(BASE, str(path)))
    d._doctor = Doctor(config_path=path, config=d._config, netns=None, units=FakeUnits(),
                       probes=Probes(("ptrace",)), clock=FakeClock())  # fmt: skip
    assert _config_check(d._doctor).status is Status.PASS
    path.write_text('[daemon]\nlog_level = "debug"\n')
    assert _config_check(d._doctor).fix_hint == "systemctl reload ironclawd"
    d._apply(parse_config(path.read_text(), str(path)))
    assert _config_check(d._doctor).status is Status.PASS  # before: a warning for good
    path.write_text('[daemon]\nlog_level = "debug"\n[queues]\nrows_per_read = 500\n')
    d._apply(parse_config(path.read_text(), str(path)))
    check = _config_check(d._doctor)
    assert check.status is Status.WARN
    assert check.detail.endswith("but [queues] differ from what runs")
    assert check.fix_hint == "systemctl restart ironclawd (a reload does not apply them)"
