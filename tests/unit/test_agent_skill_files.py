"""The agent's file tools and /skills (agent/tools.py): read_file and list_files read an installed
skill under ``/skills/`` with the workspace's jail rules (no '..', no symlink escape, no symlink
as the last component); write_file refuses /skills; a relative ``skills/...`` is the workspace."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent import tools

BODY = "---\nname: notes\ndescription: Takes notes.\n---\nWrite notes to notes/.\n"


@pytest.fixture
def box(tmp_path: Path) -> tuple[Path, Path]:
    workspace, skills = tmp_path / "workspace", tmp_path / "skills"
    (skills / "notes" / "ref").mkdir(parents=True)
    (skills / "notes" / "SKILL.md").write_text(BODY)
    (skills / "notes" / "ref" / "style.md").write_text("Be brief.\n")
    workspace.mkdir()
    (tmp_path / "secret.txt").write_text("host secret\n")
    os.symlink(tmp_path / "secret.txt", skills / "notes" / "escape.md")
    os.symlink(tmp_path, skills / "notes" / "up")
    os.symlink("SKILL.md", skills / "notes" / "alias.md")
    return workspace, skills


def read(box: tuple[Path, Path], path: str) -> str:
    return tools.read_file({"path": path}, *box)


def test_a_skill_body_is_read_from_skills(box: tuple[Path, Path]) -> None:
    assert read(box, "/skills/notes/SKILL.md") == BODY
    assert read(box, "/skills//notes/./ref/style.md") == "Be brief.\n"
    listing = json.loads(tools.list_files({"path": "/skills"}, *box))
    assert listing == ["notes/"]
    assert json.loads(tools.list_files({"path": "/skills/notes"}, *box)) == [
        "SKILL.md", "alias.md", "escape.md", "ref/", "up/",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("/skills/../secret.txt", "must stay inside /skills"),
        ("/skills/notes/../../secret.txt", "must stay inside /skills"),
        ("/skills/notes/escape.md", "resolves outside /skills"),
        ("/skills/notes/up/secret.txt", "resolves outside /skills"),
        ("/skills/notes/alias.md", "Too many levels of symbolic links"),  # O_NOFOLLOW
        ("/skills/notes", "not a regular file"),
        ("/skillsx/notes/SKILL.md", "must stay inside the workspace"),
        ("/etc/passwd", "must stay inside the workspace"),
        ("/skills/notes/SKILL.md\0", "without NUL"),
    ],
)
def test_reads_outside_the_skills_are_refused(
    box: tuple[Path, Path], path: str, needle: str
) -> None:
    with pytest.raises((tools.ToolError, OSError), match=needle):
        read(box, path)


@pytest.mark.parametrize("path", ["/skills/notes/SKILL.md", "/skills/new.md", "/skills"])
def test_write_file_refuses_skills(box: tuple[Path, Path], path: str) -> None:
    workspace, skills = box
    with pytest.raises(tools.ToolError, match="/skills is read-only"):
        tools.write_file({"path": path, "content": "evil"}, workspace)
    assert (skills / "notes" / "SKILL.md").read_text() == BODY
    assert not (skills / "new.md").exists()


def test_a_relative_skills_path_is_the_workspace(box: tuple[Path, Path]) -> None:
    workspace, _ = box
    tools.write_file({"path": "skills/notes/SKILL.md", "content": "mine"}, workspace)
    assert (workspace / "skills" / "notes" / "SKILL.md").read_text() == "mine"
    assert read(box, "skills/notes/SKILL.md") == "mine"
    assert read(box, "/skills/notes/SKILL.md") == BODY


def test_the_tool_runner_reports_refusals_as_text() -> None:
    said = tools.run_tool("write_file", json.dumps({"path": "/skills/x", "content": "x"}))
    assert said == "error: path '/skills/x': /skills is read-only"
    said = tools.run_tool("read_file", json.dumps({"path": "/skills/../etc/passwd"}))
    assert said == "error: path '../etc/passwd': must stay inside /skills"
