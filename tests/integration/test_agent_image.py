"""The shipped agent image carries no attack code: the red-team probe is a separate program.

The agent frozen by ``packaging/build-agent`` (what ``scripts/install-dev`` and the .deb install,
and what the daemon copies into every box) is opened the way PyInstaller's bootloader reads it:
the archive appended to the executable, its PYZ of frozen modules, ``base_library.zip`` and
every other file of the tree. No module of the probe (``redteam_probe``, ``*.probes``,
``*.attacks``) and none of the probe's distinctive strings may be in it. The frozen probe,
scanned the same way, must show all of them: the scan can see what it looks for.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from PyInstaller.archive.readers import CArchiveReader

from tests.harness.probe import build

pytestmark = pytest.mark.integration

# Strings only the probe's code holds: its CLI, its attack ids, the files its attacks create.
MARKERS = (
    b"--probe-attack",
    b"--probe-grep",
    b"gateway.forged-agent",
    b"fs.root.overwrite-agent",
    b".ironclaw-write-probe-",
    b"hog: holding",
)


def _probe_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "redteam_probe" or "probes" in parts or "attacks" in parts


def frozen_contents(tree: Path, program: str) -> tuple[set[str], Iterator[tuple[str, bytes]]]:
    """(module names frozen into ``program``, (where, bytes) of everything its tree holds)."""
    archive = CArchiveReader(str(tree / program))
    pyz = archive.open_embedded_archive("PYZ.pyz")
    modules = set(archive.toc) | set(pyz.toc)

    def blobs() -> Iterator[tuple[str, bytes]]:
        for name in archive.toc:
            yield f"{program}:{name}", archive.extract(name)
        for name in pyz.toc:
            code = pyz.extract(name, raw=True)
            if code is not None:  # None: a namespace package (no code of its own)
                yield f"PYZ:{name}", code
        for path in sorted(tree.rglob("*")):
            if not path.is_file() or path.is_symlink():
                continue
            yield str(path.relative_to(tree)), path.read_bytes()
            if path.name.endswith(".zip"):
                with zipfile.ZipFile(path) as bundled:
                    for member in bundled.namelist():
                        yield f"{path.name}:{member}", bundled.read(member)

    return modules, blobs()


def scan(tree: Path, program: str) -> tuple[list[str], dict[bytes, list[str]]]:
    """The probe's modules and, per marker, where it was found (in decompressed contents)."""
    modules, blobs = frozen_contents(tree, program)
    found: dict[bytes, list[str]] = {marker: [] for marker in MARKERS}
    for where, data in blobs:
        for marker in MARKERS:
            if marker in data:
                found[marker].append(where)
    return sorted(m for m in modules if _probe_module(m)), found


def test_the_shipped_agent_has_no_probe_module_and_no_probe_string() -> None:
    agent = build("agent")
    modules, found = scan(agent, "agent")
    assert modules == []
    assert {marker: where for marker, where in found.items() if where} == {}
    assert not (agent / "probe").exists()


def test_the_scan_finds_every_probe_module_and_string_in_the_frozen_probe() -> None:
    """Control: the same scan on the probe's own build sees what it looks for."""
    modules, found = scan(build("probe"), "probe")
    assert {"redteam_probe.attacks", "redteam_probe.probes", "redteam_probe.probes.fs"} <= set(
        modules
    )
    assert [marker for marker, where in found.items() if not where] == []
