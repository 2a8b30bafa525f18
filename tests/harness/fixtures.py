"""Shared fixtures for the root tiers (integration, red team, e2e): a real systemd and ironclawd.

Loaded once, as a plugin, by tests/conftest.py: a session-scoped fixture defined in two conftest
files would be two fixtures and boot two systemds when tiers run together.

`private_systemd` is one systemd for the whole session (booting costs well under a second, but
tests should not each pay it); `private_systemd_factory` boots extra ones for tests about the
harness itself. Both are torn down even when tests fail; the harness also registers an atexit
hook and ties the namespace's life to this process, for runs that die harder than that.

Under CI (``CI`` set) or with ``IRONCLAW_REQUIRE_REAL=1``, a test of these tiers that skips fails
instead (`pytest_runtest_makereport` below), and so does a module or conftest of theirs that
skips while it is collected (``pytest.skip(..., allow_module_level=True)``,
``pytest.importorskip``: `pytest_make_collect_report` below): without root, systemd or runsc a
run must not pass on the unit tier alone. Only a skip the operator asked for (its reason starts
with `OPTED_OUT`) stays a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from tests.harness.private_systemd import (
    SYSTEMD,
    HarnessError,
    PrivateSystemd,
    SystemdHarness,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
# The tiers that need the real thing: tests/<tier>/ under the run's root directory.
REAL_TIERS = ("integration", "redteam", "e2e")
# A skip the operator chose (IRONCLAW_E2E=0, say) rather than one the machine forced.
OPTED_OUT = "opted out: "
# A drop-in of the tests' own (see the daemon fixture); under /run, so no boot keeps it.
START_LIMIT = Path("/run/systemd/system/ironclawd.service.d/50-tests-start-limit.conf")


def real_required() -> bool:
    """Whether skipping a real tier is a failure: under CI or IRONCLAW_REQUIRE_REAL=1."""
    ci = os.environ.get("CI", "").strip().lower()
    return ci not in ("", "0", "false", "no") or os.environ.get("IRONCLAW_REQUIRE_REAL") == "1"


def skip_unless_required(reason: str) -> NoReturn:
    """Skip a test whose prerequisite this machine lacks (OCI schemas, a filesystem that takes
    FS_APPEND_FL), in any tier; under CI or IRONCLAW_REQUIRE_REAL=1 fail instead: CI's machine
    has them, and a skip there would pass a check that never ran."""
    __tracebackhide__ = True  # the skip is reported at the caller's line
    if real_required():
        pytest.fail(f"may not skip under CI or IRONCLAW_REQUIRE_REAL=1: {reason}", pytrace=False)
    pytest.skip(reason)


def _real_tier(node: pytest.Item | pytest.Collector) -> str | None:
    """The real tier ``node`` belongs to: a test, a module or a directory (its conftest can
    skip the whole tier) under tests/<tier>/."""
    try:
        parts = node.path.relative_to(node.config.rootpath).parts
    except ValueError:
        return None
    if len(parts) >= 2 and parts[0] == "tests" and parts[1] in REAL_TIERS:
        return parts[1]
    return None


def _fail_a_forced_skip(
    node: pytest.Item | pytest.Collector, report: pytest.TestReport | pytest.CollectReport
) -> None:
    """Under CI, turn ``report``'s skip of a real tier into a failure, unless opted out."""
    tier = _real_tier(node)
    if tier is None or not real_required():
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    reason = reason.removeprefix("Skipped: ")
    if reason.startswith(OPTED_OUT):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"{node.nodeid}: the {tier} tier may not skip under CI or IRONCLAW_REQUIRE_REAL=1 "
        f"(it would pass on the unit tier alone): {reason}"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Under CI, a real tier's skip is a failure (an xfail stays an xfail)."""
    report = yield
    if report.skipped and not hasattr(report, "wasxfail"):
        _fail_a_forced_skip(item, report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """Under CI, a real tier's module (or conftest) that skips while it is collected is a
    collection error: such a skip reaches no test, so the hook above never sees it. Here,
    before any ``pytest_collectreport`` counts the report, rather than in that hook."""
    report = yield
    if report.skipped:
        _fail_a_forced_skip(collector, report)
    return report


def missing_runsc() -> str | None:
    """Why sessions cannot run sandboxes here (no runsc on PATH), or None."""
    if shutil.which("runsc") is None:
        return "needs runsc (gVisor) on PATH to run sandboxes (scripts/install-deps installs it)"
    return None


def missing_prerequisite() -> str | None:
    """Why a private systemd cannot be booted here, or None if it can."""
    if os.environ.get("IRONCLAW_USE_HOST_SYSTEMD") == "1" and Path("/run/systemd/system").is_dir():
        return None
    if os.geteuid() != 0:
        return "needs root to boot a private systemd (unshare, mounts, pivot_root)"
    for tool in ("unshare", "nsenter", "setpriv", "mount", "pivot_root", "systemctl"):
        if shutil.which(tool) is None:
            return f"needs {tool} (util-linux/systemd) to boot a private systemd"
    if not Path(SYSTEMD).exists():
        return f"needs systemd at {SYSTEMD}"
    if "overlay" not in Path("/proc/filesystems").read_text().split():
        return "needs overlayfs in the kernel (/proc/filesystems lacks 'overlay')"
    return None


def harness_binds() -> list[Path]:
    """What must stay writable inside: the checkout, its venv if elsewhere, results/."""
    RESULTS.mkdir(exist_ok=True)
    binds = [ROOT, RESULTS]
    venv = (ROOT / ".venv").resolve()
    if venv.is_dir() and not venv.is_relative_to(ROOT):
        binds.append(venv)
    return binds


def _boot(name: str) -> SystemdHarness:
    reason = missing_runsc() or missing_prerequisite()
    if reason is not None:
        pytest.skip(reason)
    try:
        return PrivateSystemd.boot(harness_binds(), name)
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def private_systemd() -> Iterator[SystemdHarness]:
    """One booted systemd for the session; `.run(argv, user=...)` executes inside it."""
    sd = _boot("ironclaw-test")
    try:
        yield sd
    finally:
        sd.close()


@pytest.fixture
def private_systemd_factory() -> Iterator[Callable[[], SystemdHarness]]:
    """Boot additional systemds (for tests of the harness); all closed at test end."""
    with contextlib.ExitStack() as stack:

        def boot() -> SystemdHarness:
            sd = _boot("ironclaw-test-extra")
            stack.callback(sd.close)
            return sd

        yield boot


@pytest.fixture(scope="session")
def daemon(private_systemd: SystemdHarness) -> Iterator[SystemdHarness]:
    """ironclawd.service installed from this checkout (scripts/install-dev) and started by the
    private systemd, with two users: ``alice`` (in ironclaw-admin) and ``outsider`` (not)."""
    # The tests restart the daemon dozens of times a minute between them, and systemd refuses a
    # sixth start within 10 s ("start of the service was attempted too often"; CI met it in
    # stop 45). The start limit guards a host against a crash loop, which the tests catch by
    # NRestarts instead, so this systemd allows more starts; the shipped unit is unchanged.
    private_systemd.run(["mkdir", "-p", str(START_LIMIT.parent)], check=True)
    limit = b"[Unit]\nStartLimitBurst=1000\n"
    private_systemd.run(["tee", str(START_LIMIT)], input=limit, check=True)
    proc = private_systemd.run(["scripts/install-dev", "--with-probe"], timeout=300)
    # A first start that failed is a bug even when Restart= then brought the daemon up: one
    # start in ten failed so, hidden, before the mount namespace's pin was made to retry.
    restarts = private_systemd.run(["systemctl", "show", "-P", "NRestarts", "ironclawd"])
    if proc.returncode != 0 or restarts.stdout.strip() != b"0":
        journal = private_systemd.run(["journalctl", "-u", "ironclawd", "-n", "40", "--no-pager"])
        pytest.fail(
            f"scripts/install-dev: {proc.stdout.decode()}{proc.stderr.decode()}\n"
            f"restarts by systemd: {restarts.stdout.decode().strip()}\n"
            f"journal of ironclawd:\n{journal.stdout.decode(errors='replace')}"
        )
    script = """
        set -e
        id outsider >/dev/null 2>&1 || useradd -M -s /usr/sbin/nologin outsider
        id alice >/dev/null 2>&1 || useradd -M -s /usr/sbin/nologin -G ironclaw-admin alice
        # Let them reach the checkout's virtualenv: directory modes are changed in the overlay
        # only (the checkout itself is a bind mount and is left as it is).
        d=$PWD; while [ "$d" != / ]; do d=$(dirname "$d"); chmod o+x "$d" 2>/dev/null || true; done
        # ...and its interpreter, which a venv made by pyenv's python finds under /root (0700).
        # ironctl is a wrapper script (scripts/install-dev): its shell's exec of the venv's
        # entry point needs every directory up to the real interpreter searchable.
        d=$(readlink -f .venv/bin/python3)
        while [ "$d" != / ]; do d=$(dirname "$d"); chmod o+x "$d" 2>/dev/null || true; done
    """
    proc = private_systemd.run(["bash", "-c", script])
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    yield private_systemd
    teardown = f"rm -f /etc/ironclaw/ironclawd.toml {START_LIMIT}; systemctl stop ironclawd"
    private_systemd.run(["bash", "-c", teardown])


@pytest.fixture(scope="module")
def roomy_gateway(daemon: SystemdHarness) -> Iterator[SystemdHarness]:
    """The daemon with room for a module's change submissions: the gateway counts an hour of each
    caller's changes in its store, across modules and restarts, and a whole run submits far more
    as root than the default 20 an hour. The default configuration is put back afterwards."""
    config = "/etc/ironclaw/ironclawd.toml"
    room = "[gateway]\\nsubmissions_per_hour = 1000\\n"
    script = f"printf '{room}' > {config}; systemctl restart ironclawd"
    proc = daemon.run(["bash", "-c", script])
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    yield daemon
    daemon.run(["bash", "-c", f"rm -f {config}; systemctl restart ironclawd"])
