"""Every ironctl sub-command, read from its argparse parser, so a new command is covered by the
hostile-argument tests without anyone remembering to add it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ironclawd.ctl.main import build_parser


@dataclass(frozen=True)
class Command:
    """One leaf command: its words (``("session", "logs")``) and what it takes."""

    words: tuple[str, ...]
    positionals: tuple[str, ...]  # metavars of required positional arguments, in order
    options: tuple[str, ...]  # every option string
    required: tuple[str, ...]  # options that must be given (first string of each)
    valued: tuple[str, ...]  # options that take a value (first string of each)
    numeric: tuple[str, ...]  # options whose value is a range-checked integer
    optional_positionals: tuple[str, ...] = ()  # metavars of positionals that may be left out
    choices: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (option or metavar, its choices)

    @property
    def name(self) -> str:
        return " ".join(self.words)


def commands() -> list[Command]:
    found: list[Command] = []
    _walk(build_parser(), (), found)
    return found


def _walk(parser: argparse.ArgumentParser, words: tuple[str, ...], found: list[Command]) -> None:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if subs:
        for name, child in subs[0].choices.items():
            _walk(child, (*words, name), found)
        return
    actions = parser._actions
    found.append(
        Command(
            words=words,
            positionals=tuple(
                str(a.metavar or a.dest) for a in actions if not a.option_strings and a.nargs != "?"
            ),
            options=tuple(s for a in actions for s in a.option_strings),
            required=tuple(a.option_strings[0] for a in actions if a.option_strings and a.required),
            valued=tuple(a.option_strings[0] for a in actions if a.option_strings and a.nargs != 0),
            numeric=tuple(
                a.option_strings[0]
                for a in actions
                if a.option_strings and getattr(a.type, "__name__", "") == "integer"
            ),
            optional_positionals=tuple(
                str(a.metavar or a.dest) for a in actions if not a.option_strings and a.nargs == "?"
            ),
            choices=tuple(
                ((a.option_strings or [str(a.metavar or a.dest)])[0], tuple(map(str, a.choices)))
                for a in actions
                if a.choices and not isinstance(a, argparse._SubParsersAction)
            ),
        )
    )
