"""host/skills.py: an agent's skills written to a content-addressed, immutable directory (what
/skills binds), each file checked against its hash; unused sets collected at daemon start."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from pathlib import Path

import pytest

from ironclawd.domain.skills import AgentSkill, SkillFile
from ironclawd.errors import SandboxError
from ironclawd.host.skills import (
    collect_skill_sets,
    materialise_skill_set,
    skill_set_digest,
)


def _file(path: str, text: str) -> SkillFile:
    return SkillFile(path, hashlib.sha256(text.encode()).hexdigest(), text)


def _skill(name: str = "notes", *files: SkillFile) -> AgentSkill:
    files = files or (_file("SKILL.md", "---\nname: notes\n---\nTake notes.\n"),)
    return AgentSkill(name, "1.0", "Takes notes.", "0" * 16, "0" * 64, files)


SKILLS = (
    _skill("notes", _file("SKILL.md", "# Notes\n"), _file("ref/style.md", "Be brief. é\n")),
    _skill("review"),
)


def _tree(root: Path) -> dict[str, tuple[int, bytes | None]]:
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        data = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
        found[str(path.relative_to(root))] = (stat.S_IMODE(info.st_mode), data)
    return found


def test_a_set_is_written_once_with_its_bytes_and_read_only_modes(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    dest = materialise_skill_set(SKILLS, root)
    assert dest == root / skill_set_digest(SKILLS)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755
    assert _tree(dest) == {
        "notes": (0o755, None),
        "notes/SKILL.md": (0o644, b"# Notes\n"),
        "notes/ref": (0o755, None),
        "notes/ref/style.md": (0o644, "Be brief. é\n".encode()),
        "review": (0o755, None),
        "review/SKILL.md": (0o644, b"---\nname: notes\n---\nTake notes.\n"),
    }
    if os.geteuid() == 0:
        assert {p.stat().st_uid for p in dest.rglob("*")} == {0}
    inode = (dest / "notes" / "SKILL.md").stat().st_ino
    assert materialise_skill_set(tuple(reversed(SKILLS)), root) == dest  # reused, same set
    assert (dest / "notes" / "SKILL.md").stat().st_ino == inode
    assert os.listdir(root) == [dest.name]  # no temp directory left


def test_the_digest_names_the_set_not_its_order() -> None:
    assert skill_set_digest(SKILLS) == skill_set_digest(tuple(reversed(SKILLS)))
    changed = (_skill("notes", _file("SKILL.md", "# Notes!\n")), SKILLS[1])
    assert skill_set_digest(changed) != skill_set_digest(SKILLS)
    assert skill_set_digest(SKILLS[:1]) != skill_set_digest(SKILLS)


def test_a_file_whose_bytes_do_not_match_its_hash_is_refused_and_nothing_written(
    tmp_path: Path,
) -> None:
    bad = SkillFile("SKILL.md", hashlib.sha256(b"approved").hexdigest(), "swapped")
    with pytest.raises(SandboxError, match=r"skill notes: file 'SKILL.md': content does not match"):
        materialise_skill_set((_skill("notes", bad),), tmp_path / "skills")
    assert not (tmp_path / "skills").exists() or os.listdir(tmp_path / "skills") == []


@pytest.mark.parametrize(
    "path", ["../x", "/etc/passwd", "a/../../b", "", "a//b", "./a", "a/", "a\\b", "a\0b", "."]
)
def test_unsafe_paths_are_refused(tmp_path: Path, path: str) -> None:
    with pytest.raises(SandboxError, match="expected a normalised relative path"):
        materialise_skill_set((_skill("notes", _file(path, "x")),), tmp_path)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("skills", "needle"),
    [
        ((_skill("Up"),), "is not a valid name"),
        ((_skill("../x"),), "is not a valid name"),
        ((_skill("a"), _skill("a")), "appears twice"),
        ((_skill("a", _file("x", "1"), _file("x/y", "2")),), "both a file and a directory"),
    ],
)
def test_bad_names_and_clashing_paths_are_refused(
    tmp_path: Path, skills: tuple[AgentSkill, ...], needle: str
) -> None:
    with pytest.raises(SandboxError, match=needle):
        materialise_skill_set(skills, tmp_path)


def test_a_set_altered_on_disk_is_refused_not_reused(tmp_path: Path) -> None:
    dest = materialise_skill_set(SKILLS, tmp_path)
    target = dest / "notes" / "SKILL.md"
    target.chmod(0o644)
    target.write_bytes(b"# Evil\n")
    with pytest.raises(SandboxError, match=r"notes/SKILL\.md altered on disk"):
        materialise_skill_set(SKILLS, tmp_path)
    target.write_bytes(b"# Notes\n")
    (dest / "review" / "extra.md").write_text("planted")
    with pytest.raises(SandboxError, match="files differ from the set"):
        materialise_skill_set(SKILLS, tmp_path)
    (dest / "review" / "extra.md").unlink()
    target.unlink()
    target.symlink_to("/etc/passwd")
    with pytest.raises(SandboxError, match="writing skill set"):
        materialise_skill_set(SKILLS, tmp_path)


def test_sessions_starting_together_share_one_set(tmp_path: Path) -> None:
    results: list[Path] = []
    errors: list[BaseException] = []

    def make() -> None:
        try:
            results.append(materialise_skill_set(SKILLS, tmp_path))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=make) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert set(results) == {tmp_path / skill_set_digest(SKILLS)}
    assert os.listdir(tmp_path) == [skill_set_digest(SKILLS)]


def _bundle(bundles: Path, sid: str, *sources: str) -> None:
    (bundles / sid).mkdir(parents=True)
    mounts = [{"destination": "/x", "type": "bind", "source": s} for s in sources]
    (bundles / sid / "config.json").write_text(json.dumps({"mounts": mounts}))


def test_sets_no_bundle_names_are_collected(tmp_path: Path) -> None:
    root, bundles = tmp_path / "skills", tmp_path / "bundles"
    used = materialise_skill_set(SKILLS, root)
    unused = materialise_skill_set(SKILLS[:1], root)
    (root / f".{used.name}.tmp-x").mkdir()  # a crash while building
    _bundle(bundles, "s1", str(used), "/var/lib/ironclaw/queues/s1")
    (bundles / "s2").mkdir()  # a bundle dir without config.json uses nothing
    removed = collect_skill_sets(root, bundles)
    assert sorted(removed) == sorted([unused.name, f".{used.name}.tmp-x"])
    assert os.listdir(root) == [used.name]
    assert collect_skill_sets(tmp_path / "absent", bundles) == []


def test_an_unreadable_bundle_keeps_every_set(tmp_path: Path) -> None:
    root, bundles = tmp_path / "skills", tmp_path / "bundles"
    kept = materialise_skill_set(SKILLS, root)
    (bundles / "s1").mkdir(parents=True)
    (bundles / "s1" / "config.json").write_text("{not json")
    assert collect_skill_sets(root, bundles) == []
    assert os.listdir(root) == [kept.name]


def test_a_set_that_cannot_be_removed_is_left_and_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "skills"
    stale = materialise_skill_set(SKILLS, root)

    def refuse(path: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("ironclawd.host.skills.shutil.rmtree", refuse)
    assert collect_skill_sets(root, tmp_path / "bundles") == []
    assert os.listdir(root) == [stale.name]
    assert "could not remove" in caplog.text


def test_with_no_set_to_remove_no_bundle_is_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Every start calls this: with nothing under the root, the bundles (one a session) are left
    # unread, so even an unreadable one says nothing.
    root, bundles = tmp_path / "skills", tmp_path / "bundles"
    root.mkdir()
    (bundles / "s1").mkdir(parents=True)
    (bundles / "s1" / "config.json").write_text("{not json")
    assert collect_skill_sets(root, bundles) == []
    assert caplog.records == []
