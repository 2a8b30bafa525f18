"""The man pages: ironctl(1) and ironclawd(8) from their parsers, ironclawd.toml(5) from the
config reference (the same rows as docs/config.md)."""

from __future__ import annotations

import argparse
from datetime import UTC
from email.utils import parsedate_to_datetime

from ironclawd import __version__
from ironclawd.docgen import handwritten as hw
from ironclawd.docgen import roff
from ironclawd.docgen.model import Command, Option, common_options, read_option
from ironclawd.docgen.model import read as read_commands
from ironclawd.domain.message_ids import MessageId, message_id


def ironctl_page(parser: argparse.ArgumentParser, date: str) -> str:
    root = read_commands(parser)
    out = roff.title("ironctl", "1", __version__, date)
    out += [*roff.section("NAME"), f"ironctl \\- {roff.escape(hw.CTL_SUMMARY)}"]
    out += roff.section("SYNOPSIS")
    out += [".B ironctl", "[\\fIOPTIONS\\fR] \\fICOMMAND\\fR [\\fIVERB\\fR] [\\fIARGUMENTS\\fR]"]
    out += [".br", ".B ironctl \\-\\-version"]
    out += roff.section("DESCRIPTION")
    for text in hw.CTL_DESCRIPTION:
        out += roff.paragraph(text)
    out += roff.section("OPTIONS")
    out += roff.paragraph("Accepted before or after the command:")
    for option in common_options(parser):
        out += roff.tagged(_option_tag(option), option.help)
    out += roff.section("COMMANDS")
    out += [".PP", "Every command also takes \\fB\\-\\-json\\fR, \\fB\\-\\-no\\-legend\\fR,"
            " \\fB\\-\\-socket\\fR, \\fB\\-\\-timeout\\fR and \\fB\\-h\\fR"
            " (see \\fBOPTIONS\\fR)."]  # fmt: skip
    for top in root.children:
        out += roff.subsection(top.name)
        if top.children:
            out += roff.paragraph(top.description)
            out += _notes(top)
            if top.examples:
                out += [".PP", "Examples:", *roff.literal(top.examples)]
            for leaf in top.leaves():
                out += _leaf(leaf)
        else:
            out += _leaf(top)
    out += roff.section("EXAMPLES")
    out += roff.literal(root.examples)
    out += roff.paragraph("A first session:")
    out += roff.literal(hw.CTL_TOUR)
    out += _exit_status(hw.EXIT_STATUS)
    out += roff.section("DIAGNOSTICS")
    for text in hw.CTL_ERRORS:
        out += roff.paragraph(text)
    out += _pairs("ENVIRONMENT", hw.CTL_ENVIRONMENT)
    out += _pairs("FILES", hw.CTL_FILES)
    out += [*roff.section("SEE ALSO"), *roff.see_also(hw.CTL_SEE_ALSO)[1:]]
    return roff.finish(out)


def ironclawd_page(parser: argparse.ArgumentParser, date: str, catalog: str) -> str:
    """``catalog``: the text of units/ironclaw.catalog (its ids and subjects are listed)."""
    options = [read_option(a) for a in parser._actions if a.option_strings]
    out = roff.title("ironclawd", "8", __version__, date)
    out += [*roff.section("NAME"), f"ironclawd \\- {roff.escape(hw.DAEMON_SUMMARY)}"]
    out += roff.section("SYNOPSIS")
    out += [".B ironclawd", " ".join(_usage(o) for o in options if o.flags[0] != "-h")]
    out += roff.section("DESCRIPTION")
    for text in hw.DAEMON_DESCRIPTION:
        out += roff.paragraph(text)
    out += roff.section("OPTIONS")
    for option in options:
        out += roff.tagged(_option_tag(option), option.help)
    out += _pairs("SIGNALS", hw.DAEMON_SIGNALS)
    out += roff.section("JOURNAL")
    field = next(iter(message_id(MessageId.DAEMON_READY)))
    out += roff.paragraph(hw.DAEMON_JOURNAL.format(field=field))
    for entry_id, subject in catalog_entries(catalog):
        fields = [roff.inline(part) if i % 2 == 0 else roff.italic(part)
                  for i, part in enumerate(subject.split("@"))]  # fmt: skip
        out += [".TP", roff.bold(entry_id), "".join(fields)]
    out += _exit_status(hw.DAEMON_EXIT_STATUS)
    out += _pairs("ENVIRONMENT", hw.DAEMON_ENVIRONMENT)
    out += _pairs("FILES", hw.DAEMON_FILES)
    out += [*roff.section("SEE ALSO"), *roff.see_also(hw.DAEMON_SEE_ALSO)[1:]]
    return roff.finish(out)


def toml_page(reference_markdown: str, defaults: dict[str, str], date: str) -> str:
    """``defaults``: each key's default as TOML (configref.toml_defaults); a key without one is
    required."""
    out = roff.title("ironclawd.toml", "5", __version__, date)
    out += [*roff.section("NAME"), "ironclawd.toml \\- configuration of ironclawd(8)"]
    out += roff.section("DESCRIPTION")
    for text in hw.TOML_DESCRIPTION:
        out += roff.paragraph(text)
    out += roff.section("KEYS")
    table = ""
    for key, _default, expected, meaning in reference_rows(reference_markdown):
        here, _, name = key.rpartition(".")
        here = "[[channels]]" if here == "channels[]" else f"[{here}]"
        if here != table:
            out += roff.subsection(here)
            table = here
        value = defaults.get(key)
        shown = " (required)" if value is None else f" = {value}"
        out += [".TP", roff.bold(name) + roff.escape(shown), roff.inline(meaning)]
        out += [".br", roff.inline(f"Expected: {expected}.")]
    out += roff.section("EXAMPLE")
    out += roff.literal(hw.TOML_EXAMPLE.splitlines())
    out += [*roff.section("FILES"), ".TP", roff.bold("/etc/ironclaw/ironclawd.toml")]
    out += ["the file ironclawd reads (\\fB\\-\\-config\\fR names another)"]
    out += [*roff.section("SEE ALSO"), *roff.see_also(hw.TOML_SEE_ALSO)[1:]]
    return roff.finish(out)


def catalog_entries(catalog: str) -> list[tuple[str, str]]:
    """(message id, Subject) of each entry of a journal message catalog (journalctl(1))."""
    entries: list[tuple[str, str]] = []
    entry_id = ""
    for line in catalog.splitlines():
        if line.startswith("-- "):
            entry_id = line[3:].strip()
        elif line.startswith("Subject:") and entry_id:
            entries.append((entry_id, line.removeprefix("Subject:").strip()))
            entry_id = ""
    return entries


def release_date(changelog: str) -> str:
    """The date of the newest entry of a debian/changelog (its first trailer line), as
    YYYY-MM-DD in UTC; "" without one."""
    for line in changelog.splitlines():
        if line.startswith(" -- ") and "  " in line[4:]:
            when = parsedate_to_datetime(line[4:].split("  ", 1)[1].strip())
            return when.astimezone(UTC).date().isoformat()  # as SOURCE_DATE_EPOCH is read
    return ""


def reference_rows(markdown: str) -> list[tuple[str, str, str, str]]:
    """The rows of the config reference table: key, default, expected, meaning (Markdown)."""
    rows = []
    for line in markdown.splitlines()[2:]:
        cells = line.removeprefix("| ").removesuffix(" |").split(" | ")
        if len(cells) != 4:
            raise ValueError(f"config reference row of {len(cells)} cells: {line}")
        key, default, expected, meaning = cells
        rows.append((key.strip("`"), default.strip("`"), expected, meaning))
    return rows


def _leaf(cmd: Command) -> list[str]:
    out = [".PP", _synopsis(cmd), ".RS 4", roff.inline(cmd.description)]
    note = hw.CTL_NOTES.get(" ".join(cmd.words))
    if note:
        out += roff.paragraph(note)
    for option in cmd.options:
        out += roff.tagged(_option_tag(option), option.help or "")
    out += _notes(cmd)
    if cmd.examples:
        out += [".PP", "Examples:", *roff.literal(cmd.examples)]
    out.append(".RE")
    return out


def _notes(cmd: Command) -> list[str]:
    out: list[str] = []
    for note in cmd.notes:
        out += roff.paragraph(note)
    return out


def _synopsis(cmd: Command) -> str:
    positionals = [_usage(o) for o in cmd.options if not o.flags]
    optionals = [_usage(o) for o in cmd.options if o.flags]
    return " ".join((roff.bold(cmd.name), *positionals, *optionals))


def _usage(option: Option) -> str:
    if option.flags:
        text = roff.bold(option.flags[0]) + (f" {roff.italic(option.args)}" if option.args else "")
    else:
        text = roff.italic(option.args.strip("[]"))
    bracketed = not option.required or option.args.startswith("[")
    return (f"[{text}]" if bracketed else text) + ("..." if option.repeatable else "")


def _option_tag(option: Option) -> str:
    if not option.flags:
        return roff.italic(option.args)
    flags = ", ".join(roff.bold(f) for f in option.flags)
    return flags + (f" {roff.italic(option.args)}" if option.args else "")


def _exit_status(codes: tuple[tuple[int, str], ...]) -> list[str]:
    out = roff.section("EXIT STATUS")
    for code, text in codes:
        out += roff.tagged(roff.bold(str(code)), text)
    return out


def _pairs(heading: str, pairs: tuple[tuple[str, str], ...]) -> list[str]:
    out = roff.section(heading)
    for name, text in pairs:
        out += roff.tagged(roff.bold(name), text)
    return out
