"""The generated man pages and bash completion as the shipped package uses them: man renders
each page without a warning (lintian's manpage-has-errors-from-man runs this very command),
lexgrog finds each NAME line (whatis), and bash completes ironctl's commands, options and paths."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.harness.ctl_commands import commands

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["docs/man/ironctl.1", "docs/man/ironclawd.8", "docs/man/ironclawd.toml.5"]


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, **env},
    )  # fmt: skip


@pytest.mark.parametrize("page", PAGES)
def test_man_renders_the_page_without_warnings(page: str) -> None:
    # lintian's check (checks/documentation/manual.pm): the warnings of man --warnings.
    done = _run(
        ["man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", page],
        LC_ALL="C.UTF-8", MANROFFSEQ="", MANWIDTH="80",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    shown = _run(["man", "-l", page], MANWIDTH="80", PAGER="cat").stdout
    text = re.sub(".\b", "", shown)  # overstrike (bold, underline) off
    for heading in ("NAME", "SYNOPSIS" if not page.endswith(".5") else "KEYS", "SEE ALSO"):
        assert f"\n{heading}\n" in text, (page, heading)


@pytest.mark.parametrize("page", PAGES)
def test_whatis_reads_the_name_line(page: str) -> None:
    done = _run(["lexgrog", page])
    name = Path(page).name.rsplit(".", 1)[0]
    assert done.returncode == 0, done.stdout + done.stderr
    assert f'"{name} - ' in done.stdout


def _complete(*words: str) -> list[str]:
    script = (
        "source completions/ironctl.bash\n"
        'COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}\n'
        '_shtab_ironctl; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = _run(["bash", "--norc", "--noprofile", "-c", script, "bash", *words])
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completes_every_command_and_option() -> None:
    tops = {cmd.words[0] for cmd in commands()}
    assert set(_complete("ironctl", "")) >= tops
    assert _complete("ironctl", "ses") == ["session"]
    for cmd in commands():
        if len(cmd.words) == 2 and cmd.words[1] != cmd.words[0]:
            assert cmd.words[1] in _complete("ironctl", cmd.words[0], ""), cmd.name
    logs = _complete("ironctl", "session", "logs", "--")
    assert {"--lines", "--follow", "--json", "--socket", "--timeout"} <= set(logs)


def test_bash_completes_paths_for_files() -> None:
    assert "docs/man" in _complete("ironctl", "skill", "verify", "--pubkey", "docs/m")
    assert "docs/man" in _complete("ironctl", "containment", "verify", "docs/m")
    assert "docs/man" in _complete("ironctl", "change", "submit", "--persona-file", "docs/m")


def test_check_docs_names_the_stale_file_and_the_fix(tmp_path: Path) -> None:
    names = [*PAGES, "docs/ironctl.md", "docs/config.md", "completions/ironctl.bash"]
    for name in [*names, "completions/_ironctl", "debian/changelog", "units/ironclaw.catalog"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    fine = _run(["scripts/gen-cli-docs", "--check", "--root", str(tmp_path)])
    assert (fine.returncode, fine.stderr) == (0, "")
    page = tmp_path / "docs/man/ironctl.1"
    page.write_text(page.read_text().replace("keep printing new lines", "keep printing"))
    stale = _run(["scripts/gen-cli-docs", "--check", "--root", str(tmp_path)])
    assert stale.returncode == 1
    assert stale.stderr.startswith("docs/man/ironctl.1 is out of date: run `make docs`")
    assert "+keep printing new lines" in stale.stderr
    assert page.read_text().count("keep printing new lines") == 0  # --check writes nothing
