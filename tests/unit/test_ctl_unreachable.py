"""What ironctl prints when it cannot reach ironclawd: what was wrong (no socket at the path,
nobody listening on it), what to do (is ironclawd running? systemctl status ironclawd, as
``ironctl --help`` and docs/ironctl.md say for exit 3) and the --socket path it used; and
never in place of what the command says it did. A persona edit whose re-read found the daemon
gone printed "<socket> does not exist: is ironclawd running?" alone, and the file its text was
kept in was named nowhere (found by a review). A status the daemon itself sends as
UNAVAILABLE (a channel it cannot reach) is its own words, not "cannot reach ironclawd"."""

from __future__ import annotations

import json
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import editor, exitcodes, rpc, wire
from ironclawd.ctl.main import main
from tests.unit.test_ctl_steps_persona_edit import edited_as
from tests.unit.test_ctl_wire import Servicer, serve

HINT = "is ironclawd running? (systemctl status ironclawd"


@pytest.fixture(params=["missing", "refused"])
def dead_socket(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(a socket path where no daemon listens, what connect(2) says of it)."""
    path = tmp_path / "admin.sock"
    if request.param == "missing":
        yield str(path), "No such file or directory"
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(str(path))  # bound, never listening: connect() is refused
        yield str(path), "Connection refused"


def test_no_daemon_says_what_was_wrong_what_to_do_and_the_socket_used(
    capsys: pytest.CaptureFixture[str], dead_socket: tuple[str, str]
) -> None:
    path, why = dead_socket
    assert main(["status", "--socket", path, "--timeout", "5"]) == exitcodes.UNAVAILABLE
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(f"ironctl: status: unavailable: connect to unix:{path}: {why}; "), err
    assert HINT in err, err
    assert f"--socket {path}" in err, err
    assert main(["status", "--socket", path, "--timeout", "5", "--json"]) == exitcodes.UNAVAILABLE
    error = json.loads(capsys.readouterr().out)["error"]
    assert (error["code"], error["exit"]) == ("UNAVAILABLE", exitcodes.UNAVAILABLE)
    assert why in error["message"]
    assert HINT in error["message"]


def test_a_persona_edit_that_finds_the_daemon_gone_names_the_file_its_text_is_kept_in(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    dead_socket: tuple[str, str],
) -> None:
    path, why = dead_socket

    class Daemon:
        """Answers the first read; gone by the re-read (a connect of ironctl's own)."""

        def __init__(self, channel: Any) -> None:
            self.reads = 0

        def GetAgent(self, request: Any, timeout: float) -> admin_pb2.GetAgentResponse:
            self.reads += 1
            if self.reads > 1:
                wire.open_admin_socket(path, None)
            return admin_pb2.GetAgentResponse(agent=admin_pb2.Agent(persona="You help."))

    kept_in = tmp_path / "kept"
    kept_in.mkdir()
    monkeypatch.setattr(rpc, "stub_for", Daemon)
    monkeypatch.setattr(editor, "on_terminal", lambda: True)
    monkeypatch.setattr(editor, "edit", edited_as("You are terse."))
    monkeypatch.setattr(tempfile, "tempdir", str(kept_in))
    argv = ["change", "submit", "--kind", "persona", "--agent", "demo", "--socket", path]
    assert main(argv) == exitcodes.UNAVAILABLE
    out, err = capsys.readouterr()
    [kept] = kept_in.iterdir()
    assert kept.read_text(encoding="utf-8") == "You are terse."
    assert out == ""
    assert err.count("\n") == 1, err
    assert why in err, err
    assert f"nothing submitted: your text is kept in {kept} (--persona-file {kept})" in err, err
    assert HINT in err, err


def test_an_unavailable_status_from_the_daemon_is_its_own_words(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    class Daemon(Servicer):
        def TestChannel(self, request: Any, context: Any) -> Any:
            context.abort(grpc.StatusCode.UNAVAILABLE, "webhook hooks: not listening")

    path = str(tmp_path / "admin.sock")
    server = serve(path, Daemon())  # type: ignore[abstract]
    try:
        code = main(["channel", "test", "hooks", "--socket", path, "--timeout", "5"])
    finally:
        server.stop(None)
    out, err = capsys.readouterr()
    assert (code, out) == (exitcodes.UNAVAILABLE, "")
    assert err == "ironctl: channel: unavailable: webhook hooks: not listening\n"


def test_a_send_whose_connection_was_closed_says_its_outcome_and_what_to_do(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The daemon took the connection and closed it (it stopped): the message may be queued, as
    # the handler says (common.failed_call), and what to do about the daemon comes after.
    path = str(tmp_path / "admin.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(1)

        def close_one() -> None:
            conn, _ = listener.accept()
            conn.close()

        closer = threading.Thread(target=close_one)
        closer.start()
        code = main(["send", "abcdefgh0001", "hi", "--socket", path, "--timeout", "5"])
        closer.join()
    out, err = capsys.readouterr()
    assert (code, out) == (exitcodes.UNAVAILABLE, ""), (code, out, err)
    assert err.count("\n") == 1, err
    assert "may or may not have been queued to session abcdefgh0001" in err, err
    assert f"no answer from ironclawd on {path}: {HINT}" in err, err


@pytest.mark.parametrize("name", ["A" * 300, "loop/admin.sock"])
def test_a_socket_path_no_socket_can_be_at_is_a_clear_error_not_an_internal_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    """A --socket name longer than the kernel takes (ENAMETOOLONG) or through a symlink loop
    (ELOOP): looking at the path to say why raised OSError, and ironctl printed "internal
    error" (the integration tier's hostile arguments found it)."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    path = name if name.startswith("A") else str(tmp_path / name)
    assert main(["status", "--socket", path, "--timeout", "5"]) == exitcodes.UNAVAILABLE
    _out, err = capsys.readouterr()
    assert "internal error" not in err, err
    assert "check --socket and IRONCLAW_ADMIN_SOCKET" in err, err
