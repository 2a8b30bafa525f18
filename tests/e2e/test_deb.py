"""The Debian package on a clean Debian 12 and 13: install, serve a sandbox, reload, restart,
upgrade from the previous build, remove, purge.

Per suite (bookworm, trixie) one private systemd boots with a debootstrapped root of that suite
(tests/harness/debian_root.py, cached under build/e2e/) as its overlay's lower layer and is
shared by this module's tests of that suite; apt installs the package there and resolves runsc,
python3 and the rest from the host's mirror, as `apt install ./x.deb` does for a user. Nothing
of the host's root or of the checkout's virtualenv is visible inside except the directories
holding the .debs and the apt download cache. Debian 13's runsc (20240729) offers systrap: the
daemon must use it when it works there, and doctor must say which platform is in use.

The package of a suite: IRONCLAW_E2E_DEB_<SUITE> (e.g. IRONCLAW_E2E_DEB_TRIXIE), else
`packaging/build-deb --suite <suite>` now (cached).

"The previous build" is that same .deb repacked with the version `<version>~prev`: installing it
first and then the package under test runs dpkg's real upgrade path (prerm upgrade, the new
files, postinst configure with the old version, the daemon restarted, the sandbox kept, the
conffile and /var/lib/ironclaw carried over). It does not cover a previous release whose files,
maintainer scripts, units or state format differ from this one's: such a change needs an older
published .deb to upgrade from.

Measured on 2 cores: see docs/development.md ("The e2e tier"). `make e2e` runs only this tier;
`make test` runs it too unless IRONCLAW_E2E=0. It skips, saying why, without root, debootstrap
or a reachable mirror (under CI it fails). Timings are printed per suite, never asserted
(tests write no results; benchmarks do).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
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

# apt's Dir::Cache::Archives, one per suite (apt locks it: runs of two suites may overlap).
APT_CACHE = ROOT / "build" / "e2e" / "apt-archives"
PREV_CACHE = ROOT / "build" / "e2e" / "prev"
# Debian's python per suite: the package's private venv runs on it.
PYTHON = {"bookworm": "python3.11", "trixie": "python3.13"}


@dataclass
class World:
    """One suite's booted clean Debian and what its tests left for the next ones."""

    suite: str
    deb: Path
    prev: Path
    sd: SystemdHarness
    archives: Path
    timings: dict[str, float] = field(default_factory=dict)
    sid: str = ""
    marker: str = ""
    platform: str = ""
    done: set[str] = field(default_factory=set)

    def timed(self, step: str, started: float) -> None:
        self.timings[step] = round(time.monotonic() - started, 2)

    def needs(self, step: str) -> None:
        if step not in self.done:
            pytest.fail(f"{self.suite}: needs the step {step!r} of an earlier test", pytrace=False)


def _mirror_unreachable(mirror: str) -> str | None:
    url = urllib.parse.urlsplit(mirror)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=5).close()
    except OSError as exc:
        return f"Debian mirror {url.hostname}:{port} unreachable ({exc})"
    return None


def _skip_reason(suite: str) -> str | None:
    return (
        missing_prerequisite()
        or debian_root.missing_prerequisite()
        or _mirror_unreachable(debian_root.host_sources(suite)[0])
    )


@pytest.fixture(scope="module", params=debian_root.SUITES)
def suite(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def timings() -> Iterator[dict[str, dict[str, float]]]:
    """Seconds per step and suite, printed at the end (tests write no results; benchmarks do)."""
    per_suite: dict[str, dict[str, float]] = {}
    yield per_suite
    if per_suite:
        print(f"\ne2e .deb timings (s): {json.dumps(per_suite)}")


@pytest.fixture(scope="module")
def deb(suite: str, timings: dict[str, dict[str, float]]) -> Path:
    """The package under test: IRONCLAW_E2E_DEB_<SUITE>, else packaging/build-deb (cached)."""
    override = os.environ.get(f"IRONCLAW_E2E_DEB_{suite.upper()}")
    if override:
        return Path(override).resolve(strict=True)
    started = time.monotonic()
    proc = subprocess.run(
        [str(ROOT / "packaging" / "build-deb"), "--suite", suite],
        cwd=ROOT,
        capture_output=True,
        timeout=1800,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    timings.setdefault(suite, {})["build_deb"] = round(time.monotonic() - started, 2)
    return (ROOT / proc.stdout.decode().strip().splitlines()[-1]).resolve(strict=True)


def _field(deb: Path, name: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "-f", str(deb), name], capture_output=True, check=True, text=True
    ).stdout.strip()


def previous_build(deb: Path) -> Path:
    """`deb` repacked as version `<version>~prev` (sorts before it), cached by its digest."""
    digest = hashlib.sha256(deb.read_bytes()).hexdigest()[:16]
    version = _field(deb, "Version") + "~prev"
    out = PREV_CACHE / digest / deb.name.replace(_field(deb, "Version"), version)
    if out.exists():
        return out
    tmp = PREV_CACHE / f"{digest}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tree = tmp / "tree"
    subprocess.run(["dpkg-deb", "-R", str(deb), str(tree)], check=True, capture_output=True)
    control = tree / "DEBIAN" / "control"
    text, n = re.subn(r"(?m)^Version: .*$", f"Version: {version}", control.read_text())
    assert n == 1, text
    control.write_text(text)
    built = tmp / out.name
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zzstd", "-z3", "-b", str(tree), str(built)],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(tree)
    tmp.rename(out.parent)
    return out


@pytest.fixture(scope="module")
def world(suite: str, deb: Path, timings: dict[str, dict[str, float]]) -> Iterator[World]:
    """A booted private systemd whose root is a fresh `suite`; the .debs' directories bound."""
    reason = _skip_reason(suite)
    if reason is not None:
        pytest.skip(f"e2e .deb test on {suite}: {reason}")
    steps = timings.setdefault(suite, {})
    started = time.monotonic()
    try:
        tree = debian_root.ensure_debian_root(suite)
    except debian_root.DebianRootError as exc:
        pytest.fail(f"making a clean {suite} root: {exc}", pytrace=False)
    steps["debian_root"] = round(time.monotonic() - started, 2)
    started = time.monotonic()
    prev = previous_build(deb)
    steps["repack_prev"] = round(time.monotonic() - started, 2)
    archives = APT_CACHE / suite
    (archives / "partial").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        sd = PrivateSystemd.boot(
            [deb.parent, prev.parent, archives], f"ironclaw-e2e-{suite}", lower=tree
        )
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
    steps["boot"] = round(time.monotonic() - started, 2)
    w = World(suite=suite, deb=deb, prev=prev, sd=sd, archives=archives, timings=steps)
    try:
        yield w
    finally:
        sd.close()


def sh(w: World, script: str, *, timeout: float = 120, ok: bool = True) -> str:
    """Run a shell script inside; return stdout; with ok=True fail the test on non-zero exit."""
    proc = w.sd.run(["sh", "-ec", script], timeout=timeout)
    out = proc.stdout.decode(errors="replace")
    if ok and proc.returncode != 0:
        journal = w.sd.run(["journalctl", "--no-pager", "-q", "-n", "60"], timeout=30)
        pytest.fail(
            f"inside the clean {w.suite}: `{script.strip()}` exited {proc.returncode}\n"
            f"stdout:\n{out[-3000:]}\nstderr:\n{proc.stderr.decode(errors='replace')[-3000:]}\n"
            f"journal:\n{journal.stdout.decode(errors='replace')}",
            pytrace=False,
        )
    return out


def ctl(w: World, args: str, *, timeout: float = 120) -> dict[str, object]:
    result: dict[str, object] = json.loads(sh(w, f"ironctl {args} --json", timeout=timeout))
    return result


def reply(w: World, text: str) -> str:
    sent = ctl(w, f"send {shlex.quote(w.sid)} {shlex.quote(text)}")
    return str(sent["reply"]["text"])  # type: ignore[index]


def run_jq(w: World) -> str:
    """The agent runs jq, a Debian package approved into its image, from its sandbox."""
    listed = ctl(w, "package list --agent demo")["packages"]
    assert "jq" in {p["name"] for p in listed}, listed  # type: ignore[attr-defined]
    text = reply(w, '/tool run {"program": "jq", "args": ["-n", "6 * 7"]}')
    assert "exit code 0" in text, text
    return text


def status(check: object) -> str:
    """A check's status as ironctl's JSON spells it: pass, warn, fail, skip."""
    return str(check["status"]).lower().rsplit("_", 1)[-1]  # type: ignore[index]


def invocations(w: World) -> tuple[str, str]:
    """InvocationID of the session's sandbox unit and of the daemon."""
    unit = f"ironclaw-sbx-{w.sid}.service"
    sandbox, daemon = sh(w, f"systemctl show -p InvocationID --value {unit} ironclawd").split()
    return sandbox, daemon


def leftovers(w: World) -> dict[str, str]:
    """What a removed package must not leave running: units, netns, runsc processes."""
    return {
        # Units still loaded and not inactive (after removal ironclawd.service is masked and
        # dead, as deb-systemd-helper leaves every removed package's units).
        "units": sh(
            w,
            "systemctl list-units --all --plain --no-legend 'ironclawd.service' 'ironclaw.slice'"
            " 'ironclaw-sbx-*' | awk '$3 != \"inactive\"'",
        ),
        "netns": sh(w, "ls -A /run/netns 2>/dev/null | grep '^ironclaw-' || true"),
        "runsc": sh(
            w,
            "for p in /proc/[0-9]*; do readlink $p/exe 2>/dev/null || true; done | grep runsc"
            " || true",
        ),
    }


def test_package_contents(suite: str, deb: Path) -> None:
    """The layout the package promises (docs/architecture.md §8): checked without installing."""
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, check=True)
    # "-rwxr-xr-x root/root 203 2026-11-30 05:00 ./usr/bin/ironctl" (symlinks: "... -> target")
    paths = {
        line.split(None, 5)[5].split(" -> ")[0].lstrip(".")
        for line in listing.stdout.decode().splitlines()
    }
    # Units under /usr/lib/systemd/system on trixie, /lib/systemd/system on bookworm (merged
    # /usr: both reach the same file); dh_installsystemd picks per suite.
    units = "/lib/systemd/system"
    if "/usr/lib/systemd/system/ironclawd.service" in paths:
        units = "/usr/lib/systemd/system"
    for path in (
        "/usr/bin/ironclawd",
        "/usr/bin/ironctl",
        "/usr/lib/ironclaw/venv/bin/python3",
        "/usr/lib/ironclaw/agent/agent",
        "/usr/share/ironclaw/agent-rootfs/etc/passwd",
        f"{units}/ironclawd.service",
        f"{units}/ironclaw.slice",
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
    depends = _field(deb, "Depends")
    # procps: /bin/kill, which ExecReload runs (minbase has none); libc6 and the rest of the
    # shared libraries: computed by dh_shlibdeps.
    for dep in ("runsc", "systemd", "dbus", "iproute2", "procps", "libc6", PYTHON[suite]):
        assert dep in depends, f"Depends lacks {dep}: {depends}"
    conffiles = subprocess.run(
        ["dpkg-deb", "--ctrl-tarfile", str(deb)], capture_output=True, check=True
    ).stdout
    assert b"/etc/ironclaw/ironclawd.toml" in conffiles


def test_install_serve_reload_restart(world: World) -> None:
    """The previous build from apt on a minbase root: started, a sandbox served, reloaded (on a
    minimal Debian: no /bin/kill unless the package pulls it in), restarted with the sandbox
    kept, and doctor naming the platform the daemon uses."""
    w = world
    assert sh(w, "test ! -e /usr/bin/runsc && test ! -e /usr/bin/ironctl && echo clean") == (
        "clean\n"
    ), "the lower tree is not a clean Debian"

    # apt install ./ironclaw_*.deb: dependencies from the mirror, downloads cached across runs.
    started = time.monotonic()
    out = sh(
        w,
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q"
        f" -o Dir::Cache::Archives={shlex.quote(str(w.archives))}/"
        f" {shlex.quote(str(w.prev))}",
        timeout=600,
    )
    w.timed("apt_install", started)
    assert "Setting up ironclaw" in out, out

    # The daemon was enabled and started by postinst, and told systemd it was ready.
    show = sh(w, "systemctl show -p Type -p ActiveState -p UnitFileState -p NRestarts "
                 "ironclawd.service")  # fmt: skip
    assert "Type=notify" in show, show
    # Not active, or active only after systemd restarted it: what the daemon said (a first
    # start that failed shows as "activating", the auto-restart pending, by the time apt
    # returns; or as NRestarts above 0 once that restart came up).
    started_once = "ActiveState=active" in show and "NRestarts=0" in show
    journal = ""
    if not started_once:
        journal = sh(w, "journalctl -u ironclawd --no-pager -o cat -n 60 2>&1 || true")
    assert started_once, show + journal
    assert "UnitFileState=enabled" in show, show
    assert sh(w, "getent group ironclaw-admin >/dev/null && stat -c %a /var/lib/ironclaw") == (
        "700\n"
    )

    # doctor: every required check passes, and it names the platform in use. The daemon picks
    # systrap when runsc offers it and a trial sandbox runs on it, else ptrace; never kvm.
    started = time.monotonic()
    doctor = ctl(w, "doctor")
    w.timed("doctor", started)
    checks = {str(c["name"]): c for c in doctor["checks"]}  # type: ignore[attr-defined]
    failed = [c for c in checks.values() if c.get("required") and status(c) == "fail"]
    assert doctor["ok"], json.dumps(doctor, indent=2)
    assert not failed, json.dumps(doctor, indent=2)
    offered = sh(w, "runsc help platforms").split()
    summary = str(checks["runsc.platform"]["detail"])
    systrap = checks.get("runsc.platform.systrap")
    if suite_offers_systrap := "systrap" in offered:
        assert systrap is not None, json.dumps(doctor, indent=2)
        expected = "systrap" if status(systrap) == "pass" else "ptrace"
        if expected == "ptrace":  # doctor says why systrap is not used
            assert "systrap" in summary, json.dumps(doctor, indent=2)
            assert systrap["detail"], json.dumps(doctor, indent=2)
    else:
        expected = "ptrace"
    assert f"'{expected}'" in summary, summary
    assert w.suite == "bookworm" or suite_offers_systrap, f"Debian 13's runsc offers {offered}"
    w.platform = expected

    # A real runsc sandbox of the built-in demo agent, and a round trip through the mock model.
    started = time.monotonic()
    created = ctl(w, "session create --agent demo")
    w.timed("session_create", started)
    session = created.get("session", created)
    w.sid = str(session["sid"])  # type: ignore[index]
    shown = ctl(w, f"session show {shlex.quote(w.sid)}")
    assert w.platform in json.dumps(shown), (w.platform, shown)
    units = sh(w, "systemctl list-units --plain --no-legend --state=active 'ironclaw-sbx-*'")
    assert w.sid in units, units
    # Its own netns, held by runsc's parent (the name is released once the unit runs): not the
    # host's, and nothing in it but lo.
    pid = sh(w, f"systemctl show -P MainPID ironclaw-sbx-{w.sid}.service").strip()
    assert f"ironclaw-{w.sid}" not in sh(w, "ls -A /run/netns 2>/dev/null || true")
    inodes = sh(w, f"stat -L -c %i /proc/{pid}/ns/net /proc/1/ns/net").split()
    assert len(set(inodes)) == 2, inodes
    links = sh(w, f"nsenter --net=/proc/{pid}/ns/net ip -o link").splitlines()
    assert [line.split(":")[1].strip() for line in links] == ["lo"], links
    started = time.monotonic()
    assert "hello" in reply(w, "hello")
    w.timed("send_reply", started)
    # A Debian package through the gateway, from the installed daemon: apt resolves and
    # downloads in the helper units (Debian's python3 with the package's site-packages), the
    # image is built at approval, and the agent runs jq from its sandbox.
    started = time.monotonic()
    tools = "read_file,write_file,list_files,request_change,run"
    for submit in (f"change submit --kind tools --agent demo --tools {tools}",
                   "package add jq --agent demo"):  # fmt: skip
        change = ctl(w, submit, timeout=180)
        decided = ctl(w, f"change approve {change['id']} --yes", timeout=180)
        assert decided["state"] == "applied", decided
    w.timed("package_jq", started)
    assert "42" in run_jq(w)

    # Data of the session's own: a file in its workspace, read back after restart and upgrade
    # (written after the approvals above: a file written before them was gone after them).
    w.marker = f"marker-{w.suite}-{time.time_ns()}"
    wrote = reply(w, f'/tool write_file {{"path": "marker.txt", "content": "{w.marker}"}}')
    assert "error" not in wrote.lower(), wrote

    # reload: ExecReload signals the daemon (it must exist on a minbase root), which re-reads
    # the config (the log level is live) in the same process, as the journal shows.
    conf = "/etc/ironclaw/ironclawd.toml"
    sh(w, f"printf '\\n[daemon]\\nlog_level = \"debug\"\\n' >> {conf}")
    pid = sh(w, "systemctl show -p MainPID --value ironclawd").strip()
    cursor = sh(w, "journalctl --show-cursor -n 0 -q | sed -n 's/^-- cursor: //p'").strip()
    started = time.monotonic()
    sh(w, "systemctl reload ironclawd")
    w.timed("reload", started)
    assert sh(w, "systemctl show -p MainPID --value ironclawd").strip() == pid
    reloaded = sh(
        w,
        f"journalctl -u ironclawd --after-cursor={shlex.quote(cursor)} -o json --no-pager",
    )
    entries = [json.loads(line) for line in reloaded.splitlines() if line.strip()]
    assert [
        e for e in entries if "configuration reloaded" in str(e.get("MESSAGE")) and e["_PID"] == pid
    ], reloaded[-3000:]
    assert sh(w, "systemctl is-active ironclawd") == "active\n"

    # restart: a new daemon adopts the running sandbox (its unit is not restarted).
    before = invocations(w)
    started = time.monotonic()
    sh(w, "systemctl restart ironclawd")
    w.timed("restart", started)
    after = invocations(w)
    assert after[0] == before[0], "the restart restarted the sandbox"
    assert after[1] != before[1], "the daemon did not restart"
    assert w.marker in reply(w, '/tool read_file {"path": "marker.txt"}')
    w.done.add("installed")


def test_upgrade_keeps_config_sessions_and_sandboxes(world: World) -> None:
    """dpkg -i of the package under test over the previous build: only the daemon restarts;
    the sandbox keeps running and is adopted; config, session data and the audit chain stay."""
    w = world
    w.needs("installed")
    version = _field(w.deb, "Version")
    before = invocations(w)
    started = time.monotonic()
    out = sh(w, f"dpkg -i {shlex.quote(str(w.deb))} 2>&1", timeout=300)
    w.timed("upgrade", started)
    assert f"Unpacking ironclaw ({version}) over ({version}~prev)" in out, out
    assert sh(w, "dpkg-query -W -f='${Version}' ironclaw") == version
    after = invocations(w)
    assert after[0] == before[0], "the upgrade restarted the sandbox"
    assert after[1] != before[1], "the upgrade did not restart the daemon"
    assert sh(w, "systemctl is-active ironclawd") == "active\n"
    assert 'log_level = "debug"' in sh(w, "cat /etc/ironclaw/ironclawd.toml"), "conffile lost"
    started = time.monotonic()
    assert w.marker in reply(w, '/tool read_file {"path": "marker.txt"}')
    w.timed("send_after_upgrade", started)
    assert "again" in reply(w, "again")
    assert "42" in run_jq(w)
    verified = ctl(w, f"session verify {shlex.quote(w.sid)}")
    assert verified.get("ok", True), verified
    shown = ctl(w, f"session show {shlex.quote(w.sid)}")
    assert w.platform in json.dumps(shown), (w.platform, shown)
    assert ctl(w, "doctor")["ok"]
    w.done.add("upgraded")


def test_remove_then_purge(world: World) -> None:
    """dpkg -r stops the daemon and every sandbox and keeps state; --purge deletes it."""
    w = world
    w.needs("upgraded")
    started = time.monotonic()
    out = sh(w, "dpkg -r ironclaw", timeout=180)
    w.timed("dpkg_remove", started)
    left = leftovers(w)
    assert left == {"units": "", "netns": "", "runsc": ""}, f"{out}\nleft behind: {left}"
    assert sh(w, "test ! -e /usr/bin/ironctl && test -d /var/lib/ironclaw && echo kept") == (
        "kept\n"
    )
    assert sh(w, "test -f /etc/ironclaw/ironclawd.toml && echo conffile") == "conffile\n"

    # dpkg --purge: says what it deletes, then the state and config are gone.
    started = time.monotonic()
    out = sh(w, "dpkg --purge ironclaw 2>&1", timeout=120)
    w.timed("dpkg_purge", started)
    assert "deleting /var/lib/ironclaw" in out, out
    assert sh(w, "test ! -e /var/lib/ironclaw && test ! -e /etc/ironclaw && echo purged") == (
        "purged\n"
    ), out
    # The pin of the outbound mount namespace (host/mountns.py) went with it.
    assert sh(w, "test ! -e /run/ironclaw/mntns && echo unpinned") == "unpinned\n", out
    assert "ironclaw" not in sh(w, "dpkg-query -W -f='${Package} ${Status}\\n' 'ironclaw*' || true")
