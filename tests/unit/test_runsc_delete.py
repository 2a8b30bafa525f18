"""``runsc.delete_state``: runsc runs when its root holds something of the container, and only
then (a ``runsc delete`` with nothing to delete is a ~26 ms start of runsc, paid twice by a
removal after a stop). No runsc is run here: a recording runner stands in for it. That the real
runsc deletes what it left is tests/contract/test_runtime.py's (real tier)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from ironclawd.errors import HostError, InvalidArgument
from ironclawd.host import runsc

CID = "ironclaw-abc123"


class Runner:
    def __init__(self, returncode: int = 0) -> None:
        self.calls: list[list[str]] = []
        self._returncode = returncode

    def __call__(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        return subprocess.CompletedProcess(list(argv), self._returncode, "", "no such thing\n")


def _root(tmp_path: Path, *names: str) -> Path:
    root = tmp_path / "runsc"
    root.mkdir()
    for name in names:
        (root / name).touch()
    return root


@pytest.mark.parametrize(
    "names",
    [
        (f"{CID}_sandbox:{CID}.state", f"{CID}_sandbox:{CID}.lock"),  # as runsc 20221219 keeps it
        (f"{CID}_sandbox:{CID}.lock",),  # stopped while runsc was still creating it
        (CID,),  # a directory of its own, as other versions might keep it
        (f"{CID}.state",),
    ],
)
def test_runsc_deletes_a_container_it_has_state_for(tmp_path: Path, names: tuple[str]) -> None:
    root = _root(tmp_path, *names, "ironclaw-other_sandbox:ironclaw-other.state")
    run = Runner()
    runsc.delete_state(root, CID, Path("/usr/bin/runsc"), run)
    assert run.calls == [["/usr/bin/runsc", f"--root={root}", "delete", "-force", CID]]


@pytest.mark.parametrize(
    "names",
    [
        (),
        # Another container whose id starts with this one's is not this one's.
        (f"{CID}4_sandbox:{CID}4.state", f"{CID}x.lock", "ironclaw-abc12_sandbox:x.state"),
    ],
)
def test_nothing_runs_for_a_container_runsc_holds_nothing_of(
    tmp_path: Path, names: tuple[str, ...]
) -> None:
    root = _root(tmp_path, *names)
    run = Runner()
    runsc.delete_state(root, CID, Path("/usr/bin/runsc"), run)
    runsc.delete_state(tmp_path / "no-such-root", CID, Path("/usr/bin/runsc"), run)
    assert run.calls == []
    assert sorted(p.name for p in root.iterdir()) == sorted(names)


def test_a_root_that_cannot_be_read_leaves_it_to_runsc(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    assert runsc.state_files(not_a_dir, CID) is None
    run = Runner(returncode=1)
    with pytest.raises(HostError, match=f"deleting runsc container {CID}: runsc exited 1"):
        runsc.delete_state(not_a_dir, CID, Path("/usr/bin/runsc"), run)
    assert len(run.calls) == 1


@pytest.mark.parametrize("container_id", ["../escape", "", "x" * 129])
def test_an_id_runsc_would_refuse_is_refused_before_the_root_is_read(
    tmp_path: Path, container_id: str
) -> None:
    run = Runner()
    with pytest.raises(InvalidArgument, match="container id"):
        runsc.delete_state(tmp_path, container_id, Path("/usr/bin/runsc"), run)
    with pytest.raises(InvalidArgument, match="container id"):
        runsc.state_files(tmp_path, container_id)
    assert run.calls == []


def test_state_files_names_what_the_root_holds_of_the_container(tmp_path: Path) -> None:
    root = _root(tmp_path, f"{CID}_sandbox:{CID}.state", f"{CID}_sandbox:{CID}.lock", "other")
    assert runsc.state_files(root, CID) == [
        root / f"{CID}_sandbox:{CID}.lock",
        root / f"{CID}_sandbox:{CID}.state",
    ]
