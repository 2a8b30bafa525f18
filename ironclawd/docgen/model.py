"""ironctl's command tree read from its argparse parser: every group, command, option and the
examples its --help carries, in a form the renderers share."""

from __future__ import annotations

import argparse
import textwrap
from dataclasses import dataclass

from ironclawd.ctl.exitcodes import HELP as EXIT_HELP

# Fixed, so the output does not depend on the terminal it was generated on.
WIDTH = 80


@dataclass(frozen=True)
class Option:
    """One option or positional argument as a reader sees it."""

    flags: tuple[str, ...]  # ("-n", "--lines"); () for a positional argument
    args: str  # "N", "NAME [NAME ...]", "" for a flag
    help: str
    required: bool
    repeatable: bool  # action="append": may be given more than once

    @property
    def label(self) -> str:
        """``-n, --lines N`` or ``SID``."""
        if not self.flags:
            return self.args
        return ", ".join(self.flags) + (f" {self.args}" if self.args else "")

    @property
    def usage(self) -> str:
        """How the synopsis shows it: ``--agent NAME``, ``[--sid SID]``, ``[--env K=V]...``."""
        text = self.args if not self.flags else " ".join(p for p in (self.flags[0], self.args) if p)
        if not self.required:
            text = text if text.startswith("[") else f"[{text}]"
        return text + ("..." if self.repeatable else "")


@dataclass(frozen=True)
class Command:
    """A command group (children) or a command (no children)."""

    words: tuple[str, ...]  # ("session", "create"); () for ironctl itself
    summary: str  # the one line its parent's --help shows
    description: str
    options: tuple[Option, ...]  # without -h and the common options
    examples: tuple[str, ...]
    notes: tuple[str, ...]  # other paragraphs of its epilog
    children: tuple[Command, ...]

    @property
    def name(self) -> str:
        return " ".join(("ironctl", *self.words))

    @property
    def synopsis(self) -> str:
        positionals = [o.usage for o in self.options if not o.flags]
        optionals = [o.usage for o in self.options if o.flags]
        if self.children:
            positionals.append("VERB")
        return " ".join((self.name, *positionals, *optionals))

    def walk(self) -> list[Command]:
        """This command and every command below it, depth first in parser order."""
        found = [self]
        for child in self.children:
            found.extend(child.walk())
        return found

    def leaves(self) -> list[Command]:
        return [c for c in self.walk() if not c.children]


def read(parser: argparse.ArgumentParser) -> Command:
    """The tree below ``parser`` (ironctl's top-level parser)."""
    common = {s for a in parser._actions for s in a.option_strings}
    common -= {"--version"}
    return _command(parser, (), parser.description or "", common)


def common_options(parser: argparse.ArgumentParser) -> tuple[Option, ...]:
    """The top level's options (accepted before or after every command), -h last."""
    found = [read_option(a) for a in parser._actions if a.option_strings and a.dest != "help"]
    found.extend(read_option(a) for a in parser._actions if a.dest == "help")
    return tuple(found)


def _command(
    parser: argparse.ArgumentParser, words: tuple[str, ...], summary: str, common: set[str]
) -> Command:
    children: list[Command] = []
    options: list[Option] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help or "" for c in action._choices_actions}
            for name, child in action.choices.items():
                children.append(_command(child, (*words, name), helps.get(name, ""), common))
        elif _own(action, common) and (words or action.dest != "version"):
            options.append(read_option(action))
    examples, notes = _epilog(parser.epilog or "")
    return Command(
        words=words,
        summary=summary,
        description=parser.description or summary,
        options=tuple(options),
        examples=examples,
        notes=notes,
        children=tuple(children),
    )


def _own(action: argparse.Action, common: set[str]) -> bool:
    """Shown, and not one of the options every command shares."""
    return action.help is not argparse.SUPPRESS and not set(action.option_strings) & common


def read_option(action: argparse.Action) -> Option:
    formatter = argparse.HelpFormatter("ironctl", width=WIDTH)
    if action.option_strings:
        args = formatter._format_args(action, action.dest.upper()) if action.nargs != 0 else ""
    else:
        args = formatter._format_args(action, action.dest)
    text = formatter._expand_help(action) if action.help else ""
    return Option(
        flags=tuple(action.option_strings),
        args=args,
        help=" ".join(text.split()),
        required=bool(action.required),
        repeatable=isinstance(action, argparse._AppendAction),
    )


def _epilog(epilog: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Its examples (lines) and its other paragraphs; the exit codes are documented once."""
    examples: list[str] = []
    notes: list[str] = []
    for paragraph in epilog.replace(EXIT_HELP, "").split("\n\n"):
        if not paragraph.strip():
            continue
        head, _, body = paragraph.partition("\n")
        if head.strip() == "examples:":
            examples.extend(textwrap.dedent(body).splitlines())
        else:
            notes.append(" ".join(paragraph.split()))
    return tuple(examples), tuple(notes)
