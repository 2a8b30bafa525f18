"""The tests run on the interpreter the .deb's venv runs on: Debian's ``/usr/bin/python3.11``
(scripts/bootstrap-venv). A venv on another build (pyenv's, say) passes tests that the package
then fails (a standard-library feature of a later 3.11.x) and times an interpreter nobody
ships. Checked where the suite must be what ships: under CI or IRONCLAW_REQUIRE_REAL."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.harness.fixtures import real_required

DEBIAN_PYTHON = Path("/usr/bin/python3.11")


@pytest.mark.skipif(not real_required(), reason="checked under CI / IRONCLAW_REQUIRE_REAL only")
def test_the_venv_runs_debians_python() -> None:
    assert sys.prefix != sys.base_prefix, f"not in a venv: {sys.executable}"
    assert sys.base_prefix == "/usr", (
        f"the venv is built on {sys.base_prefix}, not Debian's python3.11 (/usr): "
        "rebuild it with make venv (scripts/bootstrap-venv)"
    )
    assert Path(sys.executable).resolve() == DEBIAN_PYTHON.resolve()
