"""Files an operator names to ironctl (``--persona-file``, a containment report, its signature
and ``--pubkey``, ``skill sign --key``, ``skill verify --pubkey``) are read as regular files of
bounded size: a FIFO or a device is refused, never waited on (ironctl hung on a FIFO for ever),
and a huge file is refused before it is read whole and sent."""

from __future__ import annotations

import io
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import changes, common, exitcodes, rpc
from ironclawd.ctl.main import main
from ironclawd.domain.changes import MAX_PERSONA
from tests.unit import ctl_world as world
from tests.unit import skill_samples

submitted: list[admin_pb2.SubmitChangeRequest] = []


class Stub(world.Stub):
    def SubmitChange(self, request: Any, **_: Any) -> Any:
        submitted.append(request)
        return super().SubmitChange(request)


@pytest.fixture(autouse=True)
def stub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "stub_for", Stub)
    submitted.clear()


def run_unless_it_hangs(argv: list[str], fifo: Path | None) -> tuple[int, dict[str, Any]]:
    """``ironctl ARGV --json`` in a thread; a run still waiting after 5 s is let go (``fifo``'s
    writing end opened and closed) and fails the test."""
    outcome: list[int] = []
    real = sys.stdout

    def command() -> None:
        outcome.append(main([*argv, "--json"]))

    out = io.StringIO()
    sys.stdout = out
    try:
        worker = threading.Thread(target=command, daemon=True)
        worker.start()
        worker.join(5)
        hung = worker.is_alive()
        if hung and fifo is not None:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            worker.join(5)
    finally:
        sys.stdout = real
    assert not hung, f"ironctl {' '.join(argv)} waited on a FIFO"
    return outcome[0], json.loads(out.getvalue())


def persona(path: Path) -> list[str]:
    return ["change", "submit", "--kind", "persona", "--agent", "demo", "--persona-file", str(path)]


def test_a_persona_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "persona.md"
    os.mkfifo(fifo)
    code, doc = run_unless_it_hangs(persona(fifo), fifo)
    assert code == exitcodes.INVALID
    assert doc["error"]["message"] == (
        f"--persona-file {fifo}: a FIFO, socket or device; expected a regular file"
    )
    assert submitted == []


def test_a_huge_persona_file_is_refused_before_it_is_read_and_sent(tmp_path: Path) -> None:
    big = tmp_path / "persona.md"
    with open(big, "wb") as handle:
        handle.truncate(64 * 1024 * 1024)  # sparse: 64 MiB of NULs, as /dev/zero would give
    code, doc = run_unless_it_hangs(persona(big), None)
    assert code == exitcodes.INVALID
    limit = changes.MAX_PERSONA_BYTES
    assert doc["error"]["message"] == (
        f"--persona-file {big}: more than {limit} bytes; expected at most {limit}"
    )
    assert submitted == []
    # The limit is what the daemon takes, in the largest UTF-8 it could be.
    assert limit == 4 * MAX_PERSONA
    full = tmp_path / "full.md"
    full.write_text("é" * MAX_PERSONA)
    assert run_unless_it_hangs(persona(full), None)[0] == exitcodes.OK
    assert json.loads(submitted[0].payload_json) == {"persona": "é" * MAX_PERSONA}


def offline_inputs(tmp_path: Path) -> dict[str, Callable[[Path], list[str]]]:
    """Each offline command, with the file under test at the given path and the others good."""
    key = tmp_path / "skills.key"
    key.write_text(skill_samples.KEY.to_file())
    pub = tmp_path / "skills.pub"
    pub.write_text(skill_samples.KEY.public_key().to_file())
    report = tmp_path / "report.json"
    report.write_text("{}")
    folder = str(skill_samples.write_folder(tmp_path / "skill"))
    return {
        "containment report": lambda p: ["containment", "verify", str(p), "--pubkey", str(pub)],
        "containment signature": lambda p: ["containment", "verify", str(report),
                                            "--signature", str(p), "--pubkey", str(pub)],
        "containment pubkey": lambda p: ["containment", "verify", str(report), "--pubkey", str(p)],
        "skill sign key": lambda p: ["skill", "sign", folder, "--key", str(p)],
        "skill verify pubkey": lambda p: ["skill", "verify", folder, "--pubkey", str(p)],
    }  # fmt: skip


EXITS = {
    "containment report": exitcodes.MALFORMED_REPORT,
    "containment signature": exitcodes.BAD_SIGNATURE,
    "containment pubkey": exitcodes.USAGE,
    "skill sign key": exitcodes.INVALID,
    "skill verify pubkey": exitcodes.INVALID,
}


@pytest.mark.parametrize("name", sorted(EXITS))
@pytest.mark.parametrize("kind", ["fifo", "huge"])
def test_every_file_named_on_the_command_line_is_a_bounded_regular_file(
    tmp_path: Path, name: str, kind: str
) -> None:
    argv = offline_inputs(tmp_path)[name]
    path = tmp_path / "input"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        with open(path, "wb") as handle:
            handle.truncate(64 * 1024 * 1024)
    code, doc = run_unless_it_hangs(argv(path), path if kind == "fifo" else None)
    assert code == EXITS[name], doc
    expected = "a FIFO, socket or device" if kind == "fifo" else "more than "
    assert expected in doc["error"]["message"], doc


def test_read_file_reads_a_regular_file_and_names_what_else_it_refuses(tmp_path: Path) -> None:
    text = tmp_path / "t"
    text.write_bytes(b"abc")
    assert common.read_file(str(text), 3) == b"abc"
    with pytest.raises(common.FileRefused, match="more than 2 bytes; expected at most 2"):
        common.read_file(str(text), 2)
    with pytest.raises(common.FileRefused, match="a directory; expected a regular file"):
        common.read_file(str(tmp_path), 10)
    with pytest.raises(FileNotFoundError):
        common.read_file(str(tmp_path / "missing"), 10)
