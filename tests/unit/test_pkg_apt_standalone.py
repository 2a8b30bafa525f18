"""ironclawd/host/pkg_apt.py runs as a stand-alone copy in the helper unit, with Debian's
python3 as a dynamic user: it may import the standard library only (the integration tier runs
it that way; this catches an import of the daemon's own modules before it)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "ironclawd" / "host" / "pkg_apt.py"


def test_pkg_apt_imports_only_the_standard_library() -> None:
    imported: set[str] = set()
    for node in ast.walk(ast.parse(SOURCE.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module.split(".")[0])
    assert imported, "no import found: the test reads the wrong file"
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
