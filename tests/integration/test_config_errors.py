"""Config errors at start and on reload, under the real (private) systemd (issue 11): a value of
the wrong type or a path start would refuse is exit status 78 naming the key; a reload with a bad
config always returns the unit to active (READY=1 follows RELOADING=1) with the old config in
force; ``--check-config`` makes the same checks and never prints a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.integration

CONFIG = "/etc/ironclaw/ironclawd.toml"
CHECK = [".venv/bin/ironclawd", "--config", CONFIG, "--check-config"]
WRONG_TYPE = "[agents.typo]\negress = [{host = 'example.com', methods = 5}]\n"


def sh(sysd: Any, script: str, **kwargs: Any) -> Any:
    return sysd.run(["bash", "-c", script], **kwargs)


def out(proc: Any) -> str:
    return (proc.stdout or b"").decode(errors="replace") + (proc.stderr or b"").decode(
        errors="replace"
    )


def write_config(sysd: Any, text: str) -> None:
    assert sh(sysd, f"cat > {CONFIG} <<'EOF'\n{text}EOF\n").returncode == 0


def cursor(sysd: Any) -> str:
    proc = sysd.run(["journalctl", "-n", "0", "--show-cursor", "--no-pager"])
    return out(proc).strip().rsplit("cursor: ", 1)[-1]


def journal_since(sysd: Any, mark: str) -> str:
    argv = ["journalctl", "--no-pager", "-o", "cat", "-u", "ironclawd.service"]
    return out(sysd.run([*argv, "--after-cursor", mark], timeout=60))


def show(sysd: Any, *props: str) -> dict[str, str]:
    text = out(sysd.run(["systemctl", "show", "ironclawd.service", *[f"-p{p}" for p in props]]))
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@pytest.fixture
def restore(daemon: Any) -> Iterator[Any]:
    yield daemon
    proc = sh(
        daemon,
        f"rm -f {CONFIG}; rm -rf /var/lib/ironclaw-link /var/lib/ironclaw-real; "
        "systemctl reset-failed ironclawd; systemctl restart ironclawd",
    )
    assert proc.returncode == 0, out(proc)


def test_reload_with_a_wrongly_typed_value_keeps_the_old_config_and_names_the_key(
    restore: Any,
) -> None:
    sysd = restore
    mark = cursor(sysd)
    # The bad file would also turn on debug logging: none of it may take effect.
    write_config(sysd, "[daemon]\nlog_level = 'debug'\n" + WRONG_TYPE)
    proc = sysd.run(["systemctl", "reload", "ironclawd.service"], timeout=30)
    assert proc.returncode == 0, out(proc)
    assert show(sysd, "ActiveState")["ActiveState"] == "active"
    assert sysd.run(["ironctl", "status"]).returncode == 0
    log = journal_since(sysd, mark)
    assert "reload refused" in log, log
    assert "'agents.typo.egress'" in log, log
    assert "Traceback" not in log
    assert " took " not in log  # the per-call debug line: the log level stayed at info
    # The next reload is not queued behind a stuck one, and a good config applies.
    mark = cursor(sysd)
    write_config(sysd, "[daemon]\nlog_level = 'debug'\n")
    proc = sysd.run(["systemctl", "reload", "ironclawd.service"], timeout=30)
    assert proc.returncode == 0, out(proc)
    assert show(sysd, "ActiveState")["ActiveState"] == "active"
    assert sysd.run(["ironctl", "status"]).returncode == 0
    log = journal_since(sysd, mark)
    assert "configuration reloaded" in log, log
    assert " took " in log, log


def test_start_with_a_wrongly_typed_value_exits_78_naming_the_key(restore: Any) -> None:
    sysd = restore
    mark = cursor(sysd)
    write_config(sysd, WRONG_TYPE)
    proc = sysd.run(["systemctl", "restart", "ironclawd.service"], timeout=60)
    assert proc.returncode != 0
    props = show(sysd, "ActiveState", "ExecMainStatus")
    assert props == {"ActiveState": "failed", "ExecMainStatus": "78"}, props
    log = journal_since(sysd, mark)
    assert "'agents.typo.egress'" in log, log
    assert "Traceback" not in log, log
    check = sysd.run(["env", f"PYTHONPATH={sysd.workdir}", *CHECK])
    assert check.returncode == 78, out(check)
    assert "'agents.typo.egress'" in out(check)
    assert "Traceback" not in out(check)


def test_symlinked_state_dir_fails_check_config_and_start_naming_the_key(restore: Any) -> None:
    sysd = restore
    script = "mkdir -m 700 /var/lib/ironclaw-real && ln -s ironclaw-real /var/lib/ironclaw-link"
    assert sh(sysd, script).returncode == 0
    write_config(sysd, "[daemon]\nstate_dir = '/var/lib/ironclaw-link'\n")
    check = sysd.run(["env", f"PYTHONPATH={sysd.workdir}", *CHECK])
    assert check.returncode == 78, out(check)
    assert "daemon.state_dir" in out(check), out(check)
    assert "symlink" in out(check), out(check)
    assert "Traceback" not in out(check)
    mark = cursor(sysd)
    proc = sysd.run(["systemctl", "restart", "ironclawd.service"], timeout=60)
    assert proc.returncode != 0
    assert show(sysd, "ExecMainStatus")["ExecMainStatus"] == "78"
    assert "daemon.state_dir" in journal_since(sysd, mark)


def test_missing_admin_group_fails_check_config_naming_the_key(restore: Any) -> None:
    sysd = restore
    write_config(sysd, "[admin]\ngroup = 'no-such-group'\n")
    check = sysd.run(["env", f"PYTHONPATH={sysd.workdir}", *CHECK])
    assert check.returncode == 78, out(check)
    assert "admin.group" in out(check), out(check)
    assert "Traceback" not in out(check), out(check)
