"""ironclawd/formats/minisign.py against Debian's real minisign, both ways: what we sign minisign
verifies, what minisign signs we verify, and one changed byte fails both. Then a containment
report end to end: written by the red-team module, checked by ``minisign -V`` and by the
installed ``ironctl containment verify``; and the versions a report carries, read from the real
daemon. Only the last needs the private systemd; the others need the minisign package
(scripts/install-deps), and under CI fail rather than skip without it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ironclawd
from ironclawd.ctl import exitcodes
from ironclawd.errors import SignatureMismatch
from ironclawd.formats import minisign
from ironclawd.formats.containment import AttackResult
from ironclawd.host.runsc import KNOWN_PLATFORMS, parse_version
from tests.harness.private_systemd import SystemdHarness
from tests.redteam import report

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tool() -> str:
    path = shutil.which("minisign")
    if path is None:
        pytest.skip("needs Debian's minisign (scripts/install-deps installs it)")
    return path


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    # cwd: ``python -m ironclawd...`` runs this checkout's code.
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=30, check=False, cwd=report.ROOT
    )


def flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_what_we_sign_minisign_verifies(tool: str, tmp_path: Path) -> None:
    key = minisign.generate_key()
    pub, message = tmp_path / "ours.pub", tmp_path / "message.bin"
    pub.write_text(key.public_key().to_file())
    message.write_bytes(os.urandom(5000) + "ünïcödé".encode())
    comment = "timestamp:1796000000\tfile:message.bin\thashed\tvérifié"
    Path(f"{message}.minisig").write_text(
        minisign.sign(key, message.read_bytes(), comment).to_file()
    )
    proc = run(tool, "-V", "-p", str(pub), "-m", str(message))
    assert proc.returncode == 0, proc.stderr
    assert "Signature and comment signature verified" in proc.stdout
    assert f"Trusted comment: {comment}" in proc.stdout
    flip_one_byte(message)
    proc = run(tool, "-V", "-p", str(pub), "-m", str(message))
    assert proc.returncode == 1
    assert "Signature verification failed" in proc.stderr


def test_minisign_signs_with_a_key_file_we_wrote(tool: str, tmp_path: Path) -> None:
    key = minisign.generate_key()
    secret, message = tmp_path / "ours.key", tmp_path / "m.txt"
    secret.write_text(key.to_file())
    secret.chmod(0o600)
    message.write_text("signed by minisign with our key file\n")
    proc = run(tool, "-S", "-s", str(secret), "-m", str(message), "-t", "made by minisign")
    assert proc.returncode == 0, proc.stderr
    sig = minisign.parse_signature(Path(f"{message}.minisig").read_text())
    assert minisign.verify(key.public_key(), message.read_bytes(), sig) == "made by minisign"


def test_what_minisign_signs_we_verify(tool: str, tmp_path: Path) -> None:
    pub, secret, message = tmp_path / "k.pub", tmp_path / "k.key", tmp_path / "m.bin"
    proc = run(tool, "-G", "-W", "-p", str(pub), "-s", str(secret))
    assert proc.returncode == 0, proc.stderr
    key = minisign.parse_secret_key(secret.read_text())
    public = minisign.parse_public_key(pub.read_text())
    assert key.public_key() == public
    assert key.to_file() == secret.read_text()  # byte for byte what minisign -W writes
    message.write_bytes(os.urandom(70000))
    for extra, prehashed in (((), True), (("-l",), False)):
        proc = run(tool, "-S", *extra, "-s", str(secret), "-m", str(message))
        assert proc.returncode == 0, proc.stderr
        sig = minisign.parse_signature(Path(f"{message}.minisig").read_text())
        assert sig.prehashed is prehashed
        assert minisign.verify(public, message.read_bytes(), sig).startswith("timestamp:")
    proc = run(tool, "-S", "-s", str(secret), "-m", str(message))
    sig = minisign.parse_signature(Path(f"{message}.minisig").read_text())
    flip_one_byte(message)
    with pytest.raises(SignatureMismatch):
        minisign.verify(public, message.read_bytes(), sig)
    assert run(tool, "-V", "-p", str(pub), "-m", str(message)).returncode == 1


def test_a_containment_report_verifies_with_minisign_and_ironctl(
    tool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(report, "DEFAULT_KEY", tmp_path / "build" / "containment" / "minisign.key")
    monkeypatch.delenv(report.KEY_ENV, raising=False)
    versions = {"runsc": "r", "systemd": "s", "kernel": "k", "platform": "ptrace"}
    contained = AttackResult("net.tcp.host-loopback", "network", "sandbox", "t", "contained", "no")
    escaped = AttackResult("net.tcp.host-loopback", "network", "sandbox", "t", "escaped", "yes")
    path = report.write_report([contained], [escaped], versions, tmp_path / "out")
    trusted = report.DEFAULT_KEY.parent / "minisign.pub"
    proc = run(tool, "-V", "-p", str(trusted), "-m", str(path))
    assert proc.returncode == 0, proc.stderr
    ironctl = [sys.executable, "-m", "ironclawd.ctl.main", "containment", "verify", str(path)]
    proc = run(*ironctl, "--pubkey", str(trusted))
    assert proc.returncode == exitcodes.OK, proc.stderr
    assert proc.stdout.startswith((tmp_path / "out" / "containment-report.txt").read_text())
    assert proc.stdout.splitlines()[-1].startswith("signature: good, by key ")
    path.write_bytes(path.read_bytes().replace(b'"contained"', b'"escaped"', 1))
    assert run(tool, "-V", "-p", str(trusted), "-m", str(path)).returncode == 1
    proc = run(*ironctl, "--pubkey", str(trusted))
    assert proc.returncode == exitcodes.BAD_SIGNATURE, proc.stdout + proc.stderr


def test_collect_versions_from_the_real_daemon(daemon: SystemdHarness) -> None:
    """The facts a report carries, read inside the private systemd, match the host's own."""
    versions = report.collect_versions(daemon.run)
    host_runsc = run("runsc", "--version").stdout
    assert versions["runsc"] == parse_version(host_runsc)[0]
    assert versions["kernel"] == os.uname().release
    assert re.fullmatch(r"systemd \d+ \(.*\)", versions["systemd"]), versions["systemd"]
    assert versions["platform"] in KNOWN_PLATFORMS, versions["platform"]
    assert versions["ironclaw"] == ironclawd.__version__
    assert not any(v.startswith("unknown") for v in versions.values()), versions
