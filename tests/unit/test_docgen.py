"""The generated references (ironclawd/docgen): every ironctl command and option is in the man
page, docs/ironctl.md and both completions; a changed help text is caught as drift; the committed
files are what the generator writes now."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from ironclawd import daemon
from ironclawd.config import reference_markdown
from ironclawd.ctl import exitcodes
from ironclawd.ctl.main import build_parser
from ironclawd.docgen import __main__ as docgen
from ironclawd.docgen import completion, handwritten, markdown, pages, roff
from ironclawd.docgen.configref import toml_defaults
from ironclawd.docgen.model import read as read_commands
from ironclawd.domain.message_ids import MessageId
from tests.harness.ctl_commands import commands

ROOT = Path(__file__).resolve().parents[2]
DATE = "2026-11-30"
CATALOG = (ROOT / "units/ironclaw.catalog").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return {name: make() for name, make in docgen.outputs(ROOT).items()}


def _section(text: str, start: str, stops: tuple[str, ...]) -> str:
    begin = text.index(start)
    ends = [i for stop in stops if (i := text.find(stop, begin + len(start))) != -1]
    return text[begin : min(ends, default=len(text))]


def test_every_command_and_option_is_in_the_man_page(generated: dict[str, str]) -> None:
    page = generated["docs/man/ironctl.1"]
    found = commands()
    assert len(found) > 40
    for cmd in found:
        head = f"\\fB{roff.escape('ironctl ' + cmd.name)}\\fR"
        assert head in page, cmd.name
        block = _section(page, head, ("\n.PP\n\\fBironctl ", "\n.SS ", "\n.SH "))
        for option in cmd.options:
            if option not in ("-h", "--help", "--json", "--no-legend", "--socket", "--timeout"):
                assert f"\\fB{roff.escape(option)}\\fR" in block, (cmd.name, option)


def test_every_command_and_option_is_in_the_markdown(generated: dict[str, str]) -> None:
    doc = generated["docs/ironctl.md"]
    for cmd in commands():
        heading = re.search(rf"^##+ ironctl {re.escape(cmd.name)}$", doc, re.MULTILINE)
        assert heading, cmd.name
        block = _section(doc, heading.group(0) + "\n", ("\n## ", "\n### "))
        for option in cmd.options:
            if option not in ("-h", "--help", "--json", "--no-legend", "--socket", "--timeout"):
                assert re.search(rf"\| `(.*, )?{re.escape(option)}[ ,`]", block), (cmd.name, option)
        for metavar in cmd.positionals:
            assert metavar in block, (cmd.name, metavar)


def test_the_examples_of_the_help_texts_are_in_the_docs(generated: dict[str, str]) -> None:
    doc = generated["docs/ironctl.md"]
    examples = [e for c in read_commands(build_parser()).walk() for e in c.examples]
    assert "ironctl containment verify REPORT.json --pubkey KEY.pub" in examples  # the top's
    for example in examples:
        if not example.startswith("("):
            assert example in doc, example
            assert roff.escape(example) in generated["docs/man/ironctl.1"], example
    for example in ("ironctl session logs SID --follow", "ironctl doctor --only runsc"):
        assert example in doc
        assert roff.escape(example) in generated["docs/man/ironctl.1"]


@pytest.mark.parametrize("name", ["completions/ironctl.bash", "completions/_ironctl"])
def test_completion_lists_every_command_and_option(generated: dict[str, str], name: str) -> None:
    script = generated[name]
    for cmd in commands():
        for word in cmd.words:
            assert re.search(rf"\b{re.escape(word)}\b", script), (name, cmd.name)
        for option in cmd.options:
            assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", script), (name, option)
    assert script.startswith("#compdef ironctl\n") == name.endswith("_ironctl")


def test_a_changed_help_text_is_drift(
    generated: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, text in generated.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert docgen.drift(tmp_path, generated) == []

    def changed() -> argparse.ArgumentParser:
        parser = build_parser()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        only = next(a for a in sub.choices["doctor"]._actions if a.dest == "only")
        only.help = "a new help text"
        return parser

    monkeypatch.setattr("ironclawd.ctl.main.build_parser", changed)
    now = {name: make() for name, make in docgen.outputs(ROOT).items()}
    problems = docgen.drift(tmp_path, now)
    named = sorted(p.split(" ", 1)[0] for p in problems)
    # bash completion carries no help texts; zsh shows them beside each option.
    assert named == ["completions/_ironctl", "docs/ironctl.md", "docs/man/ironctl.1"]
    assert all("make docs" in p and "a new help text" in p for p in problems)
    (tmp_path / "completions/_ironctl").unlink()
    assert any(p.startswith("completions/_ironctl is missing") for p in docgen.drift(tmp_path, now))


def test_the_committed_files_are_up_to_date(generated: dict[str, str]) -> None:
    assert docgen.drift(ROOT, generated) == []


def test_generation_is_deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    first = markdown.ironctl_markdown(build_parser())
    monkeypatch.setenv("COLUMNS", "33")
    monkeypatch.setenv("IRONCLAW_ADMIN_SOCKET", "/elsewhere.sock")
    assert markdown.ironctl_markdown(build_parser()) == first
    assert completion.bash(build_parser()) == completion.bash(build_parser())


def test_every_note_is_of_a_command(generated: dict[str, str]) -> None:
    names = {cmd.name for cmd in commands()}
    assert set(handwritten.CTL_NOTES) <= names
    assert "Audited as `channel.dropped`." in generated["docs/ironctl.md"]
    assert "Audited as \\fBchannel.dropped\\fR." in generated["docs/man/ironctl.1"]


def test_the_date_is_the_release_date() -> None:
    changelog = (
        "ironclaw (0.2.0-1) unstable; urgency=medium\n\n  * x\n\n"
        " -- A <a@b.c>  Tue, 01 Dec 2026 23:30:00 -0200\n\n"
        " -- A <a@b.c>  Mon, 30 Nov 2026 05:00:00 +0000\n"
    )
    assert pages.release_date(changelog) == "2026-12-02"  # in UTC
    assert pages.release_date("") == ""
    assert '.TH IRONCLAWD 8 "2026-11-30"' in pages.ironclawd_page(
        daemon.build_parser(), DATE, CATALOG
    )


def test_the_tour_parses() -> None:
    # The hand-written first session must stay valid ironctl: each command parses as written.
    for line in handwritten.CTL_TOUR:
        for command in line.split("#")[0].split("&&"):
            words = shlex.split(command.replace("SID", "abcdef12").replace(" ID", " 1"))
            assert words[0] == "ironctl"
            assert build_parser().parse_args(words[1:]).handler, command


def test_every_exit_code_is_documented() -> None:
    codes = {v for k, v in vars(exitcodes).items() if k.isupper() and isinstance(v, int)}
    assert {code for code, _ in handwritten.EXIT_STATUS} == codes
    assert [code for code, _ in handwritten.EXIT_STATUS] == sorted(codes)


def test_ironclawd_page_has_every_option() -> None:
    page = pages.ironclawd_page(daemon.build_parser(), DATE, CATALOG)
    for option in ("--config", "--check-config", "--print-config-reference", "--version"):
        assert f"\\fB{roff.escape(option)}\\fR" in page
    assert str(daemon.EX_CONFIG) in page


def test_ironclawd_page_lists_every_message_id() -> None:
    page = pages.ironclawd_page(daemon.build_parser(), DATE, CATALOG)
    for message_id in MessageId:
        assert f"\\fB{message_id.value}\\fR" in page, message_id
    assert "Session \\fIIRONCLAW_SID\\fR is running" in page


def test_toml_page_has_every_key() -> None:
    rows = pages.reference_rows(reference_markdown())
    page = pages.toml_page(reference_markdown(), toml_defaults(), DATE)
    assert len(rows) > 80
    defaults = toml_defaults()
    for key, *_ in rows:
        name = key.rpartition(".")[2]
        assert roff.bold(name) + (" (required)" if key not in defaults else " = ") in page, key
    assert set(defaults) < {key for key, *_ in rows}
    assert roff.escape('log_level = "info"') in page.replace("\\fR", "")
    for table in ("[gateway]", "[agents.NAME]", "[[channels]]"):
        assert f'.SS "{table}"' in page


def test_roff_escapes_what_would_be_read_as_requests() -> None:
    assert roff.escape(".hidden") == "\\&.hidden"
    assert roff.escape("a\\b-c") == "a\\eb\\-c"
    assert roff.inline("'quoted `x-y`") == "\\&'quoted \\fBx\\-y\\fR"
    for page in (
        pages.ironctl_page(build_parser(), DATE),
        pages.toml_page(reference_markdown(), toml_defaults(), DATE),
    ):
        for line in page.splitlines():
            assert not line.startswith("'"), line
            assert not line.startswith(".") or re.match(
                r"\.(\\\"|[A-Z]{1,2}\b|nh|ad|nf|fi|br)", line
            ), line
            assert "\\fB" not in line or line.count("\\fB") <= line.count("\\fR"), line
