"""docs/ironctl.md: every command group, command and option from the parser, with the examples
its --help carries, between the hand-written header and footer."""

from __future__ import annotations

import argparse

from ironclawd.docgen import handwritten as hw
from ironclawd.docgen.model import Command, Option, common_options
from ironclawd.docgen.model import read as read_commands


def ironctl_markdown(parser: argparse.ArgumentParser) -> str:
    root = read_commands(parser)
    out = ["# ironctl", ""]
    out += ["<!-- Generated from ironctl's parser by `make docs` (scripts/gen-cli-docs): edit the"]
    out += [
        "     help texts in ironclawd/ctl/ or ironclawd/docgen/handwritten.py, not this file. -->"
    ]
    out += [""]
    for text in hw.CTL_DESCRIPTION:
        out += [text, ""]
    out += ["Also as man pages: `man ironctl`, `man ironclawd`, `man ironclawd.toml`.", ""]
    out += ["| command | what |", "|---|---|"]
    out += [f"| [`{c.name}`](#{_anchor(c)}) | {_cell(c.summary)} |" for c in root.children]
    out += ["", "## Options", "", "Accepted before or after any command:", ""]
    out += _options(common_options(parser))
    for top in root.children:
        out += ["", f"## {top.name}", ""]
        if not top.children:
            out += _leaf(top)
            continue
        out += [_sentence(top.description)]
        out += _notes(top)
        if top.examples:
            out += ["", "Examples:", "", "```", *top.examples, "```"]
        for leaf in top.leaves():
            out += ["", f"### {leaf.name}", ""]
            out += _leaf(leaf)
    out += ["", "## Examples", "", "```", *root.examples, "```"]
    out += ["", "A first session:", "", "```", *hw.CTL_TOUR, "```"]
    out += ["", "## Exit codes", "", "| code | meaning |", "|---|---|"]
    out += [f"| {code} | {_cell(text)} |" for code, text in hw.EXIT_STATUS]
    out += ["", "## Errors", ""]
    for text in hw.CTL_ERRORS:
        out += [text, ""]
    out += ["## Environment", "", "| variable | meaning |", "|---|---|"]
    out += [f"| `{name}` | {_cell(text)} |" for name, text in hw.CTL_ENVIRONMENT]
    out += ["", "## Files", "", "| path | what |", "|---|---|"]
    out += [f"| `{name}` | {_cell(text)} |" for name, text in hw.CTL_FILES]
    return "\n".join(out) + "\n"


def _leaf(cmd: Command) -> list[str]:
    out = ["```", cmd.synopsis, "```", "", _sentence(cmd.description), ""]
    note = hw.CTL_NOTES.get(" ".join(cmd.words))
    if note:
        out += [note, ""]
    if cmd.options:
        out += _options(cmd.options)
        out += [""]
    out += _notes(cmd)
    if cmd.examples:
        out += ["Examples:", "", "```", *cmd.examples, "```"]
    while out and out[-1] == "":
        out.pop()
    return out


def _notes(cmd: Command) -> list[str]:
    out: list[str] = []
    for note in cmd.notes:
        out += [_sentence(note), ""]
    return out


def _options(options: tuple[Option, ...]) -> list[str]:
    out = ["| option | meaning |", "|---|---|"]
    for option in options:
        label = f"`{option.label}`" + (" (required)" if option.required and option.flags else "")
        label += " (repeatable)" if option.repeatable else ""
        out.append(f"| {label} | {_cell(option.help)} |")
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _sentence(text: str) -> str:
    text = text.strip()
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?", ")")) else text + "."


def _anchor(cmd: Command) -> str:
    return cmd.name.replace(" ", "-")
