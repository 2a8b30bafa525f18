"""``ironctl skill`` offline (sign, manifest, verify) and the refusals ``skill add`` makes before
anything reaches the daemon. The daemon side is tests/integration/test_skills.py; the real
minisign's view of ``skill sign`` is tests/integration/test_skills_minisign.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ironclawd.api.admin_changes import agent_to_proto
from ironclawd.ctl import exitcodes
from ironclawd.ctl.main import main
from ironclawd.ctl.skills import installed
from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.changes import agent_view, canonical
from ironclawd.domain.kinds.skills import KIND
from ironclawd.formats import skill as skill_format
from ironclawd.formats import skill_folder
from tests.unit import skill_samples as s

NO_DAEMON = ["--socket", "/nonexistent/admin.sock", "--json"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    code = main([*args, *NO_DAEMON])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    secret, public = tmp_path / "k.key", tmp_path / "k.pub"
    secret.write_text(s.KEY.to_file())
    public.write_text(s.KEY.public_key().to_file())
    return secret, public


def test_sign_then_verify_then_tamper(
    tmp_path: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = s.write_folder(tmp_path, signature=None)
    code, doc = run(capsys, "skill", "sign", str(folder), "--key", str(keys[0]))
    assert code == exitcodes.OK, doc
    assert doc["key_id"] == s.KEY.public_key().id_hex
    assert (folder / "SKILL.minisig").exists()
    code, doc = run(capsys, "skill", "verify", str(folder), "--pubkey", str(keys[1]))
    assert (code, doc["signer"]) == (exitcodes.OK, s.KEY.public_key().id_hex)
    (folder / "reference" / "more.md").write_text("added after signing\n")
    code, doc = run(capsys, "skill", "verify", str(folder), "--pubkey", str(keys[1]))
    assert code == exitcodes.BAD_SIGNATURE
    assert "changed after signing" in str(doc["error"])


def test_a_key_file_that_is_not_text_is_refused_without_showing_its_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--key`` given a binary secret (the daemon's master key, a raw seed) by mistake: the
    error said "can't decode byte 0xa7 in position 1", a byte of the secret on the terminal."""
    folder = s.write_folder(tmp_path, signature=None)
    secret = bytes([0x41, 0xA7]) + bytes(range(0x80, 0x9E))
    key = tmp_path / "master.key"
    key.write_bytes(secret)
    code, doc = run(capsys, "skill", "sign", str(folder), "--key", str(key))
    assert code == exitcodes.INVALID
    message = str(doc["error"])
    assert "not UTF-8 text (at byte 1)" in message
    assert "0xa7" not in message.lower()
    assert not (folder / "SKILL.minisig").exists()


def test_manifest_is_what_the_signature_covers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = s.write_folder(tmp_path)
    code, doc = run(capsys, "skill", "manifest", str(folder))
    assert code == exitcodes.OK
    assert str(doc["manifest"]).startswith("ironclaw-skill-manifest v1\n")
    assert "SKILL.minisig" not in str(doc["manifest"])


@pytest.mark.parametrize(
    ("spoil", "needle"),
    [
        (lambda f: (f / "SKILL.minisig").unlink(), "unsigned"),
        (lambda f: (f / "x.md").symlink_to("/etc/shadow"), "a symlink"),
        (lambda f: (f / "run.sh").write_text("id\n"), "not an allowed type"),
        (lambda f: (f / "SKILL.md").chmod(0o755), "executable"),
    ],
)
def test_add_refuses_locally_without_asking_the_daemon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spoil: object, needle: str
) -> None:
    folder = s.write_folder(tmp_path)
    spoil(folder)  # type: ignore[operator]
    code, doc = run(capsys, "skill", "add", str(folder), "--agent", "demo")
    assert code == exitcodes.INVALID, doc
    assert doc["error"]["code"] == "INVALID_ARGUMENT"  # type: ignore[index]
    assert needle in doc["error"]["message"]  # type: ignore[index]


def test_installed_reads_skills_from_the_agent_view() -> None:
    spec = KIND.apply(
        AgentSpec("demo"), KIND.parse(s.payload("weather", s.files(ironclaw=s.EVIL_GRANTS)))
    )
    proto = agent_to_proto(spec)
    assert proto.view_json == canonical(agent_view(spec))
    (skill,) = installed(proto)
    assert (skill["agent"], skill["name"], skill["version"]) == ("demo", "weather", "1.2.0")
    assert skill["grants"]["egress"][0]["host"] == "evil.example"
    assert [f["path"] for f in skill["files"]] == ["SKILL.md", "reference/cities.csv"]


def test_signing_never_writes_through_a_symlink_planted_meanwhile(
    tmp_path: Path,
    keys: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Root signs a folder its author owns; the author, cued by the files being read, puts a
    # symlink where the signature goes before it is written (made certain here: at signing).
    folder = s.write_folder(tmp_path / "author", signature=None)
    victim = tmp_path / "shadow"
    victim.write_text("root:x:19000:0:99999:7:::\n")
    real_sign = skill_format.sign

    def sign_then_plant(*args: Any, **kwargs: Any) -> str:
        text = real_sign(*args, **kwargs)
        (folder / skill_format.SIGNATURE_FILE).symlink_to(victim)
        return text

    monkeypatch.setattr(skill_format, "sign", sign_then_plant)
    code, doc = run(capsys, "skill", "sign", str(folder), "--key", str(keys[0]))
    assert code == exitcodes.OK, doc
    assert victim.read_text() == "root:x:19000:0:99999:7:::\n"
    signature = folder / skill_format.SIGNATURE_FILE
    assert not signature.is_symlink()
    assert signature.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in folder.iterdir()) == ["SKILL.md", "SKILL.minisig", "reference"]
    code, doc = run(capsys, "skill", "verify", str(folder), "--pubkey", str(keys[1]))
    assert (code, doc["signer"]) == (exitcodes.OK, s.KEY.public_key().id_hex)


def test_a_subfolder_swapped_for_a_symlink_is_never_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Listed as a directory, then swapped for a link to /etc while SKILL.md is read: the walk
    # opens it relative to its parent with O_NOFOLLOW and refuses it, naming it.
    folder = s.write_folder(tmp_path)
    real_read = skill_folder._read

    def read_then_swap(*args: Any) -> bytes:
        if not (folder / "reference").is_symlink():
            (folder / "reference").rename(tmp_path / "moved")
            (folder / "reference").symlink_to("/etc")
        return real_read(*args)

    monkeypatch.setattr(skill_folder, "_read", read_then_swap)
    code, doc = run(capsys, "skill", "manifest", str(folder))
    assert code == exitcodes.INVALID, doc
    assert doc["error"] == {
        "code": "INVALID_ARGUMENT",
        "message": "reference: not a plain directory; expected one",
        "exit": exitcodes.INVALID,
    }
