"""The Debian package on a clean Debian 12: install, run a real sandbox, remove, purge.

A private systemd boots with a debootstrapped bookworm (tests/harness/debian_root.py, cached
under build/e2e/) as its overlay's lower layer; apt installs dist/ironclaw_*.deb there and
resolves runsc, python3.11 and the rest from the host's mirror, as `apt install ./x.deb` does
for a user. Nothing of the host's root or of the checkout's virtualenv is visible inside except
the directory holding the .deb and the apt download cache.

Measured on 2 cores: ~2.5 min cold (build the .deb ~1.5 min, debootstrap ~40 s, apt ~10 s),
~30 s warm. `make e2e` runs only this tier; `make test` runs it too unless IRONCLAW_E2E=0.
It skips, saying why, without root, debootstrap or a reachable mirror (under CI it fails).
Timings are printed, never asserted (tests write no results; benchmarks do).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import debian_root
from tests.harness.fixtures import OPTED_OUT, ROOT, missing_prerequisite
from tests.harness.private_systemd import HarnessError, PrivateSystemd, SystemdHarness

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.environ.get("IRONCLAW_E2E") == "0",
        reason=f"{OPTED_OUT}IRONCLAW_E2E=0: the .deb on a clean Debian is not wanted in this run",
    ),
]

APT_CACHE = ROOT / "build" / "e2e" / "apt-archives"
TIMINGS: dict[str, float] = {}


def _mirror_unreachable(mirror: str) -> str | None:
    url = urllib.parse.urlsplit(mirror)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=5).close()
    except OSError as exc:
        return f"Debian mirror {url.hostname}:{port} unreachable ({exc})"
    return None


def _skip_reason() -> str | None:
    return (
        missing_prerequisite()
        or debian_root.missing_prerequisite()
        or _mirror_unreachable(debian_root.host_sources()[0])
    )


def _timed(step: str, started: float) -> None:
    TIMINGS[step] = round(time.monotonic() - started, 2)


@pytest.fixture(scope="module")
def deb() -> Path:
    """The package under test: IRONCLAW_E2E_DEB, else packaging/build-deb (cached) now."""
    if os.environ.get("IRONCLAW_E2E_DEB"):
        return Path(os.environ["IRONCLAW_E2E_DEB"]).resolve(strict=True)
    started = time.monotonic()
    proc = subprocess.run(
        [str(ROOT / "packaging" / "build-deb")],
        cwd=ROOT,
        capture_output=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    _timed("build_deb", started)
    return (ROOT / proc.stdout.decode().strip().splitlines()[-1]).resolve(strict=True)


@pytest.fixture(scope="module")
def clean_debian(deb: Path) -> Iterator[SystemdHarness]:
    """A booted private systemd whose root is a fresh bookworm; the .deb's directory is bound."""
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(f"e2e .deb test: {reason}")
    started = time.monotonic()
    try:
        tree = debian_root.ensure_debian_root()
    except debian_root.DebianRootError as exc:
        pytest.fail(f"making a clean Debian root: {exc}", pytrace=False)
    _timed("debian_root", started)
    (APT_CACHE / "partial").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        sd = PrivateSystemd.boot([deb.parent, APT_CACHE], "ironclaw-e2e", lower=tree)
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
    _timed("boot", started)
    try:
        yield sd
    finally:
        sd.close()
        print(f"\ne2e .deb timings (s): {json.dumps(TIMINGS)}")


def sh(sd: SystemdHarness, script: str, *, timeout: float = 120, ok: bool = True) -> str:
    """Run a shell script inside; return stdout; with ok=True fail the test on non-zero exit."""
    proc = sd.run(["sh", "-ec", script], timeout=timeout)
    out = proc.stdout.decode(errors="replace")
    if ok and proc.returncode != 0:
        journal = sd.run(["journalctl", "--no-pager", "-q", "-n", "60"], timeout=30)
        pytest.fail(
            f"inside the clean Debian: `{script.strip()}` exited {proc.returncode}\n"
            f"stdout:\n{out[-3000:]}\nstderr:\n{proc.stderr.decode(errors='replace')[-3000:]}\n"
            f"journal:\n{journal.stdout.decode(errors='replace')}",
            pytrace=False,
        )
    return out


def leftovers(sd: SystemdHarness) -> dict[str, str]:
    """What a removed package must not leave running: units, netns, runsc processes."""
    return {
        # Units still loaded and not inactive (after removal ironclawd.service is masked and
        # dead, as deb-systemd-helper leaves every removed package's units).
        "units": sh(
            sd,
            "systemctl list-units --all --plain --no-legend 'ironclawd.service' 'ironclaw.slice'"
            " 'ironclaw-sbx-*' | awk '$3 != \"inactive\"'",
        ),
        "netns": sh(sd, "ls -A /run/netns 2>/dev/null | grep '^ironclaw-' || true"),
        "runsc": sh(
            sd,
            "for p in /proc/[0-9]*; do readlink $p/exe 2>/dev/null || true; done | grep runsc"
            " || true",
        ),
    }


def test_package_contents(deb: Path) -> None:
    """The layout the package promises (docs/architecture.md §8): checked without installing."""
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, check=True)
    # "-rwxr-xr-x root/root 203 2026-11-30 05:00 ./usr/bin/ironctl" (symlinks: "... -> target")
    paths = {
        line.split(None, 5)[5].split(" -> ")[0].lstrip(".")
        for line in listing.stdout.decode().splitlines()
    }
    for path in (
        "/usr/bin/ironclawd",
        "/usr/bin/ironctl",
        "/usr/lib/ironclaw/venv/bin/python3",
        "/usr/lib/ironclaw/agent/agent",
        "/usr/share/ironclaw/agent-rootfs/etc/passwd",
        "/lib/systemd/system/ironclawd.service",
        "/lib/systemd/system/ironclaw.slice",
        "/usr/lib/sysusers.d/ironclaw.conf",
        "/usr/lib/tmpfiles.d/ironclaw.conf",
        "/etc/ironclaw/ironclawd.toml",
        "/usr/share/doc/ironclaw/copyright",
        "/usr/share/doc/ironclaw/changelog.Debian.gz",
    ):
        assert path in paths, f"{path} missing from {deb.name}"
    assert not [p for p in paths if p.endswith(".py") and "/ironclaw/agent/" in p]
    # The red-team probe is test-only (tests/integration/test_agent_image.py scans the frozen
    # agent itself): neither its package, the old in-agent modules nor its frozen tree ship.
    assert not [
        p
        for p in paths
        if "redteam_probe" in p
        or "/agent/probes/" in p
        or p.endswith("/agent/attacks.py")
        or p.startswith("/usr/lib/ironclaw/agent/probe")
    ]
    control = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True, check=True
    ).stdout.decode()
    for dep in ("runsc", "systemd", "dbus", "iproute2", "python3.11", "libsystemd0", "libcap2"):
        assert dep in control, f"Depends lacks {dep}: {control}"
    conffiles = subprocess.run(
        ["dpkg-deb", "--ctrl-tarfile", str(deb)], capture_output=True, check=True
    ).stdout
    assert b"/etc/ironclaw/ironclawd.toml" in conffiles


def test_install_run_remove_purge_on_clean_debian(clean_debian: SystemdHarness, deb: Path) -> None:
    sd = clean_debian
    assert sh(sd, "test ! -e /usr/bin/runsc && test ! -e /usr/bin/ironctl && echo clean") == (
        "clean\n"
    ), "the lower tree is not a clean Debian"

    # apt install ./ironclaw_*.deb: dependencies from the mirror, downloads cached across runs.
    started = time.monotonic()
    out = sh(
        sd,
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q"
        f" -o Dir::Cache::Archives={shlex.quote(str(APT_CACHE))}/ ./{shlex.quote(deb.name)}",
        timeout=600,
    )
    _timed("apt_install", started)
    assert "Setting up ironclaw" in out, out

    # The daemon was enabled and started by postinst, and told systemd it was ready.
    show = sh(sd, "systemctl show -p Type -p ActiveState -p UnitFileState ironclawd.service")
    assert "Type=notify" in show, show
    assert "ActiveState=active" in show, show
    assert "UnitFileState=enabled" in show, show
    assert sh(sd, "getent group ironclaw-admin >/dev/null && stat -c %a /var/lib/ironclaw") == (
        "700\n"
    )

    started = time.monotonic()
    doctor = json.loads(sh(sd, "ironctl doctor --json", timeout=120))
    _timed("doctor", started)
    failed = [c for c in doctor["checks"] if c.get("required") and c["status"] == "fail"]
    assert doctor["ok"], json.dumps(doctor, indent=2)
    assert not failed, json.dumps(doctor, indent=2)

    # A real runsc sandbox of the built-in demo agent, and a round trip through the mock model.
    started = time.monotonic()
    created = json.loads(sh(sd, "ironctl session create --agent demo --json", timeout=120))
    _timed("session_create", started)
    sid = created["session"]["sid"] if "session" in created else created["sid"]
    units = sh(sd, "systemctl list-units --plain --no-legend --state=active 'ironclaw-sbx-*'")
    assert sid in units, units
    assert f"ironclaw-{sid}" in sh(sd, "ls /run/netns")
    started = time.monotonic()
    sent = json.loads(sh(sd, f"ironctl send {shlex.quote(sid)} hello --json", timeout=120))
    _timed("send_reply", started)
    assert "hello" in sent["reply"]["text"], sent

    # A Debian package through the gateway, from the installed daemon: apt resolves and
    # downloads in the helper units (Debian's python3 with the package's site-packages), the
    # image is built at approval, and the agent runs jq from its sandbox.
    started = time.monotonic()
    tools = "read_file,write_file,list_files,request_change,run"
    for submit in (f"ironctl change submit --kind tools --agent demo --tools {tools} --json",
                   "ironctl package add jq --agent demo --json"):  # fmt: skip
        change = json.loads(sh(sd, submit, timeout=180))
        decided = json.loads(sh(sd, f"ironctl change approve {change['id']} --yes --json",
                                timeout=180))  # fmt: skip
        assert decided["state"] == "applied", decided
    _timed("package_jq", started)
    listed = json.loads(sh(sd, "ironctl package list --agent demo --json"))["packages"]
    assert "jq" in {p["name"] for p in listed}, listed
    run = shlex.quote('/tool run {"program": "jq", "args": ["-n", "6 * 7"]}')
    sent = json.loads(sh(sd, f"ironctl send {shlex.quote(sid)} {run} --json", timeout=120))
    assert "exit code 0" in sent["reply"]["text"], sent
    assert "42" in sent["reply"]["text"], sent

    # Upgrade (the same package again: postinst configure with the old version): only the
    # daemon restarts; the sandbox unit keeps running and the new daemon adopts it.
    unit = f"ironclaw-sbx-{sid}.service"
    before = sh(sd, f"systemctl show -p InvocationID --value {unit} ironclawd.service").split()
    started = time.monotonic()
    sh(sd, f"dpkg -i ./{shlex.quote(deb.name)}", timeout=300)
    _timed("upgrade", started)
    after = sh(sd, f"systemctl show -p InvocationID --value {unit} ironclawd.service").split()
    assert after[0] == before[0], "the upgrade restarted the sandbox"
    assert after[1] != before[1], "the upgrade did not restart the daemon"
    started = time.monotonic()
    sent = json.loads(sh(sd, f"ironctl send {shlex.quote(sid)} again --json", timeout=120))
    _timed("send_after_upgrade", started)
    assert "again" in sent["reply"]["text"], sent

    # dpkg -r: the session, its sandbox, unit and netns and the daemon are gone; state is kept.
    started = time.monotonic()
    out = sh(sd, "dpkg -r ironclaw", timeout=180)
    _timed("dpkg_remove", started)
    left = leftovers(sd)
    assert left == {"units": "", "netns": "", "runsc": ""}, f"{out}\nleft behind: {left}"
    assert sh(sd, "test ! -e /usr/bin/ironctl && test -d /var/lib/ironclaw && echo kept") == (
        "kept\n"
    )
    assert sh(sd, "test -f /etc/ironclaw/ironclawd.toml && echo conffile") == "conffile\n"

    # dpkg --purge: says what it deletes, then the state and config are gone.
    started = time.monotonic()
    out = sh(sd, "dpkg --purge ironclaw 2>&1", timeout=120)
    _timed("dpkg_purge", started)
    assert "deleting /var/lib/ironclaw" in out, out
    assert sh(sd, "test ! -e /var/lib/ironclaw && test ! -e /etc/ironclaw && echo purged") == (
        "purged\n"
    ), out
    assert "ironclaw" not in sh(
        sd, "dpkg-query -W -f='${Package} ${Status}\\n' 'ironclaw*' || true"
    )
