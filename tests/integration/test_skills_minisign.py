"""Skill signatures against Debian's real minisign, both ways: a skill signed with ``minisign -S``
over the manifest ``ironctl skill manifest`` prints verifies, and one byte changed in a file does
not; what ``ironctl skill sign`` writes, ``minisign -V`` accepts over that manifest. The manifest
is also what coreutils' sha256sum prints, so a signer needs no IronClaw code to make it.
Needs the minisign package (scripts/install-deps); no daemon."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ironclawd.errors import SignatureMismatch
from ironclawd.formats import skill as skill_format
from ironclawd.formats.skill_folder import read_folder
from tests.redteam import report
from tests.unit import skill_samples as s

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tool() -> str:
    path = shutil.which("minisign")
    if path is None:
        pytest.skip("needs Debian's minisign (scripts/install-deps installs it)")
    return path


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, cwd=report.ROOT
    )


def ironctl(*args: str) -> subprocess.CompletedProcess[str]:
    return run(sys.executable, "-m", "ironclawd.ctl.main", *args)


@pytest.fixture
def keys(tool: str, tmp_path: Path) -> tuple[Path, Path]:
    """A key pair minisign made (-W: no password, so nothing asks)."""
    secret, public = tmp_path / "skills.key", tmp_path / "skills.pub"
    proc = run(tool, "-G", "-W", "-p", str(public), "-s", str(secret))
    assert proc.returncode == 0, proc.stderr
    return secret, public


def trusted(public: Path) -> dict[str, str]:
    return {public.name: public.read_text()}


def test_a_skill_signed_by_minisign_verifies_and_one_byte_changed_does_not(
    tool: str, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    secret, public = keys
    folder = s.write_folder(tmp_path, skill_files=s.files(ironclaw=s.EVIL_GRANTS), signature=None)
    manifest = tmp_path / "manifest"
    proc = ironctl("skill", "manifest", str(folder))
    assert proc.returncode == 0, proc.stderr
    manifest.write_text(proc.stdout)
    proc = run(tool, "-S", "-s", str(secret), "-m", str(manifest))
    assert proc.returncode == 0, proc.stderr
    shutil.move(f"{manifest}.minisig", folder / skill_format.SIGNATURE_FILE)
    skill = skill_format.load(*read_folder(folder))
    signer = skill_format.verify(skill, trusted(public))
    # minisign's comment prints the key id without leading zeros ("... key 69DEDC9D97B7055" for
    # our "069DEDC9D97B7055"): compare the numbers (a 1-in-16 flake compared as text).
    shown = public.read_text().splitlines()[0].rsplit(" ", 1)[1]
    assert int(shown, 16) == int(signer, 16), (shown, signer)
    proc = ironctl("skill", "verify", str(folder), "--pubkey", str(public), "--json")
    assert (proc.returncode, json.loads(proc.stdout)["signer"]) == (0, signer)
    csv = folder / "reference" / "cities.csv"
    data = bytearray(csv.read_bytes())
    data[len(data) // 2] ^= 0x01
    csv.write_bytes(bytes(data))
    with pytest.raises(SignatureMismatch, match="changed after signing"):
        skill_format.verify(skill_format.load(*read_folder(folder)), trusted(public))
    proc = ironctl("skill", "verify", str(folder), "--pubkey", str(public))
    assert proc.returncode == 10, proc.stdout + proc.stderr


def test_what_ironctl_skill_sign_writes_minisign_accepts(
    tool: str, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    secret, public = keys
    folder = s.write_folder(tmp_path, signature=None)
    proc = ironctl("skill", "sign", str(folder), "--key", str(secret))
    assert proc.returncode == 0, proc.stderr
    manifest = tmp_path / "manifest"
    manifest.write_text(ironctl("skill", "manifest", str(folder)).stdout)
    shutil.copy(folder / skill_format.SIGNATURE_FILE, f"{manifest}.minisig")
    proc = run(tool, "-V", "-p", str(public), "-m", str(manifest))
    assert proc.returncode == 0, proc.stderr
    assert "Signature and comment signature verified" in proc.stdout
    assert "file:weather" in proc.stdout
    manifest.write_text(manifest.read_text().replace("SKILL.md", "SKILL.mD"))
    proc = run(tool, "-V", "-p", str(public), "-m", str(manifest))
    assert proc.returncode == 1
    assert "Signature verification failed" in proc.stderr


def test_the_manifest_is_sha256sum_output_under_a_header(tmp_path: Path) -> None:
    folder = s.write_folder(tmp_path, skill_files=s.files(**{"docs/a-b.md": "x\n"}))
    script = (
        "echo 'ironclaw-skill-manifest v1'; find . -type f ! -name SKILL.minisig -printf '%P\\n' "
        "| LC_ALL=C sort | xargs sha256sum"
    )
    proc = subprocess.run(
        ["bash", "-c", script], cwd=folder, capture_output=True, text=True, timeout=30, check=True
    )
    assert proc.stdout == ironctl("skill", "manifest", str(folder)).stdout
