"""``python -m ironclawd.docgen [--check]``: write every generated reference document, or with
--check write nothing and fail naming each committed file that differs from what the parsers
and the schema produce now (``make check-docs``)."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable
from pathlib import Path

FIX = "run `make docs` (scripts/gen-cli-docs) and commit the result"


def outputs(root: Path) -> dict[str, Callable[[], str]]:
    """Each generated file (relative to the repository) and how to make its text."""
    from ironclawd import daemon  # noqa: PLC0415 (heavy: imported only to generate)
    from ironclawd.config import reference_markdown  # noqa: PLC0415
    from ironclawd.ctl.main import build_parser  # noqa: PLC0415
    from ironclawd.docgen import completion, markdown, pages  # noqa: PLC0415
    from ironclawd.docgen.configref import toml_defaults  # noqa: PLC0415

    date = pages.release_date(_text(root / "debian/changelog"))
    return {
        "docs/man/ironctl.1": lambda: pages.ironctl_page(build_parser(), date),
        "docs/man/ironclawd.8": lambda: pages.ironclawd_page(
            daemon.build_parser(), date, _text(root / "units/ironclaw.catalog")
        ),
        "docs/man/ironclawd.toml.5": lambda: pages.toml_page(
            reference_markdown(), toml_defaults(), date
        ),
        "docs/ironctl.md": lambda: markdown.ironctl_markdown(build_parser()),
        "docs/config.md": lambda: config_markdown(reference_markdown()),
        "completions/ironctl.bash": lambda: completion.bash(build_parser()),
        "completions/_ironctl": lambda: completion.zsh(build_parser()),
    }


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.exists() else ""


def config_markdown(reference: str) -> str:
    return (
        "# ironclawd.toml reference\n\n"
        "Generated from `ironclawd/config.py` by `make docs`; every key is optional. "
        "An unknown key\n"
        "or a bad value stops the daemon before it binds anything, and the journal names the key.\n"
        "`ironclawd --check-config [--config PATH]` validates a file without starting anything.\n\n"
        + reference
    )


def drift(root: Path, generated: dict[str, str]) -> list[str]:
    """One message per committed file that differs from ``generated``, with the first lines of
    the difference."""
    problems = []
    for name, text in generated.items():
        path = root / name
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current == text:
            continue
        diff = difflib.unified_diff(
            current.splitlines(),
            text.splitlines(),
            f"{name} (committed)",
            f"{name} (now)",
            lineterm="",
        )
        shown = "\n".join(list(diff)[:20])
        what = "is missing" if not path.exists() else "is out of date"
        problems.append(f"{name} {what}: {FIX}\n{shown}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gen-cli-docs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail on drift; write nothing")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the repository")
    args = parser.parse_args(argv)
    generated = {name: make() for name, make in outputs(args.root).items()}
    if args.check:
        problems = drift(args.root, generated)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    for name, text in generated.items():
        path = args.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
