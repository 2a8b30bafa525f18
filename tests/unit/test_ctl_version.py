"""``ironctl --version`` and ``ironclawd --version``: the package's version, one short line;
ironctl answers it before importing grpc or the command modules."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from ironclawd import __version__, daemon
from ironclawd.ctl import cli
from ironclawd.ctl.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_the_package_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["version"] == __version__, (
        "pyproject.toml's version and ironclawd/__init__.py's __version__ (what --version and"
        " the man pages say) change together; then make docs"
    )
    assert project["scripts"]["ironctl"] == "ironclawd.ctl.cli:main"


def test_ironctl_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"ironctl {__version__}\n"
    # Through the full parser too (another option beside it), the same line.
    assert main(["--json", "--version"]) == 0
    assert capsys.readouterr().out == f"ironctl {__version__}\n"


def test_ironctl_version_imports_nothing_heavy() -> None:
    # Only the standard library's sys and ironclawd/__init__ at module level; the rest is lazy.
    imported = _module_imports("ironclawd/ctl/cli.py")
    assert imported == {"__future__", "os", "sys", "ironclawd"}  # (os: loaded at start anyway)
    # ironclawd/__init__ imports only the protobuf stand-in, which loads nothing but builtins
    # and ``types`` (test_protobuf_defer.py runs it in a fresh interpreter), and ``os``; the
    # dataclass code cache only where the daemon's unit names its file (test_dataclass_cache).
    assert _module_imports("ironclawd/__init__.py") == {"os", "ironclawd.protobuf_defer"}
    assert _module_imports("ironclawd/protobuf_defer.py") == {
        "__future__",
        "_thread",
        "sys",
        "types",
    }


def test_plain_output_does_not_import_rich() -> None:
    # Off a terminal (scripts, pipes) output is plain columns: rich only for a terminal's table
    # or a cell that is not printable ASCII (render.cell_len), not at every command's start.
    assert not any(m.startswith("rich") for m in _module_imports("ironclawd/ctl/render.py"))


def _module_imports(path: str) -> set[str]:
    """What the module at ``path`` imports at its top level (not inside functions)."""
    imported: set[str] = set()
    for node in ast.parse((ROOT / path).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    return imported


def test_ironctl_delegates_everything_else(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--bogus"]) == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_ironclawd_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        daemon.build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"ironclawd {__version__}\n"
