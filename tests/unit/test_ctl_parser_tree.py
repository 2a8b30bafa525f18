"""ironctl's parser names each command's handler as "MODULE:FUNCTION" and a run builds only the
group its command word names (ctl/main.py): every name must resolve, and the partial tree must
parse and explain a command exactly as the whole tree does."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from ironclawd.ctl import main


def _subparsers(
    parser: argparse.ArgumentParser,
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, child in subs[0].choices.items():
        yield from _leaves(child, (*path, name))


def test_every_command_names_a_handler_that_exists() -> None:
    leaves = list(_leaves(main.build_parser()))
    assert len(leaves) > 50
    for path, parser in leaves:
        handler = parser.get_default("handler")
        assert callable(main.handler_of(handler)), (path, handler)


def test_the_commands_are_the_whole_trees() -> None:
    assert set(_subparsers(main.build_parser()).choices) == main.COMMANDS


@pytest.mark.parametrize("command", sorted(main.COMMANDS))
def test_a_partial_tree_explains_its_command_as_the_whole_one(command: str) -> None:
    whole = dict(_leaves(main.build_parser()))
    part = dict(_leaves(main.build_parser(command)))
    mine = {path for path in whole if path[0] == command}
    assert mine <= set(part)
    for path in mine:
        assert part[path].format_help() == whole[path].format_help(), path
        assert part[path].get_default("handler") == whole[path].get_default("handler")


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["status"], "status"),
        (["--json", "--socket", "session", "send", "S", "hi"], "send"),
        (["--timeout=5", "--no-legend", "session", "list"], "session"),
        (["--socket", "/x"], None),
        (["-h"], None),
        (["--so", "/x", "status"], None),  # an abbreviation: argparse decides
        (["--", "status"], None),
        (["stauts"], None),
    ],
)
def test_the_command_word_is_taken_only_when_certain(argv: list[str], command: str | None) -> None:
    assert main.command_of(argv) == command
