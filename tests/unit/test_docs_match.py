"""The hand-written user documentation says what the code does: the values, names and limits it
quotes are checked here against the code they describe (the generated references are held by
test_docgen.py, the JSON shapes by test_ctl_json.py)."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.config import Config
from ironclawd.config_reload import restart_only
from ironclawd.ctl import exitcodes
from ironclawd.ctl.containment import _ERROR_CODES as CONTAINMENT_CODES
from ironclawd.ctl.main import main
from ironclawd.ctl.shapes import enum_name
from ironclawd.docgen import handwritten
from ironclawd.domain.kinds.mcp import server_view
from ironclawd.domain.mcp import McpServer
from ironclawd.errors import EXIT_CODE
from ironclawd.formats import skill as skill_format
from ironclawd.host import webhook
from ironclawd.services import inbox
from tests.redteam.report import REPORT_JSON
from tests.unit import skill_samples as s

ROOT = Path(__file__).parents[2]


def _doc(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def test_the_json_doc_names_every_session_state() -> None:
    enum = admin_pb2.SessionState.DESCRIPTOR
    states = {enum_name(enum, v.number) for v in enum.values} - {"unspecified"}
    row = next(line for line in _doc("docs/ironctl-json.md").splitlines()
               if line.startswith("| session |"))  # fmt: skip
    missing = sorted(s for s in states if f"`{s}`" not in row)
    assert not missing, f"docs/ironctl-json.md: a session's state can also be {missing}"


def test_the_json_doc_refers_only_to_tables_it_has() -> None:
    text = _doc("docs/ironctl-json.md")
    for match in re.finditer(r"the (?:table of )?([a-z ]+?) above", text):
        heading = match.group(1)
        assert re.search(rf"^#+ .*{heading}", text[: match.start()], re.M | re.I), (
            f"docs/ironctl-json.md refers to {match.group(0)!r}, which it does not have"
        )


def test_the_json_doc_shows_an_mcp_server_as_ironctl_prints_it() -> None:
    local = server_view(McpServer("time", command=("/opt/time",)))
    remote = server_view(McpServer("docs", url="https://mcp.example.com/mcp"))
    row = next(line for line in _doc("docs/ironctl-json.md").splitlines()
               if line.startswith("| MCP server |"))  # fmt: skip
    assert set(local) | set(remote) <= set(re.findall(r"`([a-z_]+)`", row)), row
    assert remote["command"] == []
    assert "`[]` for a remote server" in row, row
    assert "url" not in local
    assert "not always present" in row, row
    assert local["network"] == "none"
    assert '`"none"`' in row, row


def _own_error_codes() -> dict[str, int]:
    """Each error code ironctl reports of its own (not a daemon's status), with its exit code:
    every ``CtlError("CODE", exitcodes.NAME, ...)`` in ironclawd/ctl, and containment's."""
    found = {code: exit_code for exit_code, code in CONTAINMENT_CODES.items()}
    for path in sorted((ROOT / "ironclawd" / "ctl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "CtlError" and len(node.args) >= 2):  # fmt: skip
                continue
            code, exit_arg = node.args[0], node.args[1]
            assert isinstance(exit_arg, ast.Attribute), ast.dump(exit_arg)
            for constant in ast.walk(code):
                value = constant.value if isinstance(constant, ast.Constant) else None
                if isinstance(value, str) and re.fullmatch(r"[A-Z_]+", value):
                    found[value] = getattr(exitcodes, exit_arg.attr)
    return {c: e for c, e in found.items() if c not in EXIT_CODE}


def test_the_errors_section_names_every_code_of_ironctl_s_own_with_its_exit() -> None:
    text = " ".join(handwritten.CTL_ERRORS)
    codes = _own_error_codes()
    assert {"USAGE", "NO_REPLY", "CALLER_MISMATCH", "NOT_CONFIRMED"} <= set(codes)
    for code, exit_code in sorted(codes.items()):
        at = text.find(f"`{code}`")
        assert at >= 0, f"ironctl(1) ERRORS does not name {code} (exit {exit_code})"
        said = re.search(r"exit (\d+)", text[at:])
        assert said is not None, code
        assert int(said.group(1)) == exit_code, (code, exit_code, text[at : at + 80])


def test_exit_4_says_skill_verify_ends_there_for_a_key_not_trusted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = s.write_folder(tmp_path)  # signed by s.KEY
    stranger = tmp_path / "stranger.pub"
    stranger.write_text(s.STRANGER.public_key().to_file())
    code = main(["skill", "verify", str(folder), "--pubkey", str(stranger), "--json"])
    assert code == exitcodes.PERMISSION, capsys.readouterr()
    meaning = dict(handwritten.EXIT_STATUS)[exitcodes.PERMISSION]
    assert "`skill verify`" in meaning, meaning
    assert "`--by`" in meaning, meaning  # CALLER_MISMATCH, checked above, ends there too


def _setup_block() -> str:
    readme = _doc("README.md")
    return readme.split("## Set up and run", 1)[1].split("\n## ", 1)[0]


def test_the_readme_s_setup_commands_are_what_ci_and_the_makefile_run() -> None:
    block = _setup_block()
    ci_targets = re.findall(r"^make (\w[\w-]*)", _doc(".ci/run"), re.M)
    assert "test" in ci_targets
    assert "demo" in ci_targets  # the main job runs on every CI run too (stop 50)
    commands = re.findall(r"^    make (\w+)", block, re.M)
    assert commands == ["demo", "test"], commands
    makefile = _doc("Makefile")
    assert re.search(r"^demo: .*\n\tscripts/demo$", makefile, re.M)


def test_the_readme_names_every_step_of_make_test() -> None:
    makefile = _doc("Makefile")
    check = re.search(r"^check: (.*)$", makefile, re.M)
    assert check is not None
    commands = _setup_block().split("\n\n")[1]  # the indented block of commands
    said = " ".join(commands.split("make test", 1)[1].split())
    words = {"check-proto": "stub", "check-docs": "docs drift", "lint": "mypy", "test-unit": "unit"}
    for step in check.group(1).split():
        assert words[step] in said, (step, said)
    tiers = re.search(r"\$\(wildcard (tests/[^)]*)\)", makefile)
    assert tiers is not None
    for tier in tiers.group(1).split():
        name = {"redteam": "red-team"}.get(tier.removeprefix("tests/"), tier.removeprefix("tests/"))
        assert name in said, (tier, said)


def test_the_readme_names_the_files_make_deb_and_the_red_team_write() -> None:
    readme = _doc("README.md")
    suite = re.search(r"^SUITE \?= (\w+)$", _doc("Makefile"), re.M)
    assert suite is not None
    assert "outdir=${outdir:-dist/$suite}" in _doc("packaging/build-deb")
    assert f"`dist/{suite.group(1)}/ironclaw_<version>_amd64.deb`" in readme
    assert f"`results/{REPORT_JSON}`" in readme


def test_the_readme_lists_every_document() -> None:
    listed = _doc("README.md").split("## Documentation", 1)[1]
    missing = [
        d.name for d in sorted((ROOT / "docs").glob("*.md")) if f"`docs/{d.name}`" not in listed
    ]
    assert not missing, f"README.md's Documentation does not list {missing}"


def test_the_install_section_says_what_the_package_is() -> None:
    version = re.match(r"ironclaw \(([^)]+)\)", _doc("debian/changelog"))
    assert version is not None
    for name in ("README.md", "docs/operations.md"):
        for named in re.findall(r"ironclaw_(\d[^_]*)_amd64\.deb", _doc(name)):
            assert named == version.group(1), f"{name} names version {named} of the package"
    install = _doc("docs/operations.md").split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "python3.11" not in install.replace("3.11 on Debian 12", ""), "the suite's python3"
    for suite in ("bookworm", "trixie"):  # packaging/build-deb --suite: one package per suite
        assert suite in install, suite
    assert "/usr/lib/systemd/system/" in install  # debhelper's unit directory on Debian 13


def test_the_reload_line_says_what_a_reload_applies() -> None:
    line = next(line for line in _doc("docs/operations.md").split("\n- ")
                if line.startswith("`systemctl reload ironclawd`"))  # fmt: skip
    source = (ROOT / "ironclawd" / "daemon.py").read_text(encoding="utf-8")
    apply = source.split("def _apply(", 1)[1].split("\n    def ", 1)[0]
    live = set(re.findall(r"new\.(\w+) != self\._config\.\1", apply))
    live |= {f"daemon.{key}" for key in re.findall(r"new\.daemon\.(\w+)", apply)}
    assert live >= {"pool", "daemon.log_level"}, live
    for what in live:
        shown = f"`[{what}]`" if "." not in what else f"`{what}`"
        assert shown in " ".join(line.split()), (what, line)


def test_the_reload_line_leaves_no_change_unnamed_that_a_reload_names() -> None:
    # A reload's warning names every table and [daemon] key that waits for a restart
    # (config_reload.restart_only); the line said [queues], [mcp] and [daemon]'s other keys
    # went without a word.
    line = " ".join(next(line for line in _doc("docs/operations.md").split("\n- ")
                         if line.startswith("`systemctl reload ironclawd`")).split())  # fmt: skip
    running = Config()
    changed = {
        "[queues]": dataclasses.replace(running, queues=dataclasses.replace(
            running.queues, max_reply_bytes=running.queues.max_reply_bytes + 1)),
        "[mcp]": dataclasses.replace(running, mcp=dataclasses.replace(
            running.mcp, connect_timeout_seconds=running.mcp.connect_timeout_seconds + 1)),
        "daemon.state_dir": dataclasses.replace(running, daemon=dataclasses.replace(
            running.daemon, state_dir=Path("/srv/ic"))),
    }  # fmt: skip
    for named, new in changed.items():
        assert restart_only(running, new) == [named]
    said = re.search(r"but not for [^.]*", line)
    assert said is None, f"docs/operations.md: a reload names those too: {said.group(0)!r}"


def test_every_path_of_the_code_a_document_names_exists() -> None:
    # architecture.md and development.md name placeholders (kinds/NAME.py) and packages.
    design = {"architecture.md", "development.md"}
    docs = [f"docs/{d.name}" for d in sorted((ROOT / "docs").glob("*.md")) if d.name not in design]
    names = ["README.md", *docs]
    missing = [
        (name, path)
        for name in names
        for path in re.findall(
            r"`((?:ironclawd|agent|scripts|units|packaging)/[\w./-]*\w)`", _doc(name)
        )
        if not (ROOT / path).exists()
    ]
    assert not missing, missing


def test_the_webhook_size_refusal_says_what_is_measured() -> None:
    row = next(line for line in _doc("docs/channels.md").splitlines() if line.startswith("| 413 |"))
    assert "text exceeds the channel's `max_message_bytes`" in row, row
    assert f"plus {webhook.ENVELOPE_SLACK} bytes of envelope" in row, row


def test_the_skill_bounds_are_the_format_s() -> None:
    table = _doc("docs/skills.md").split("| rule | bound |", 1)[1].split("\n\n", 1)[0]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[1:]}
    assert f"at most {skill_format.MAX_FILES}," in rows["files"]
    assert f"each at most {skill_format.MAX_FILE_BYTES // 1024} KiB" in rows["files"]
    assert f"{skill_format.MAX_TOTAL_BYTES // 1024 // 1024} MiB in all" in rows["files"]
    assert f"{skill_format.MAX_DEPTH} levels deep" in rows["files"]
    assert f"{skill_format.MAX_PATH} characters" in rows["files"]
    component = re.search(r"`([^`]+)` per component", rows["names"])
    assert component is not None
    assert component.group(1) == skill_format._COMPONENT.pattern
    assert f"at most {skill_format.MAX_FRONT_MATTER} characters" in rows["front matter"]
    assert f"`{skill_format.VERSION_RE.pattern}`" in rows["front matter"]
    assert f"at most {skill_format.MAX_GRANTS} each" in rows["front matter"]


def test_the_notes_say_what_held_messages_and_a_remote_probe_are() -> None:
    held = handwritten.CTL_NOTES["channel held"]
    assert f"failed to take {inbox.MAX_RECEIVE_TRIES} times" in held, held
    mcp_add = handwritten.CTL_NOTES["mcp add"]
    assert "`--url`" in mcp_add, mcp_add  # a remote server: no unit, and its credentials sent
    assert "with its credentials" in mcp_add, mcp_add
