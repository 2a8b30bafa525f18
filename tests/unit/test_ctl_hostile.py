"""ironctl never shows a traceback: each class of hostile input ends as one line (JSON under
--json) and a documented exit code, before any daemon is asked (the socket does not exist)."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, render, rpc, sessions
from ironclawd.ctl import main as ctl_main
from ironclawd.ctl.main import main
from tests.harness.ctl_commands import commands

NO_DAEMON = ["--socket", "/nonexistent/ironclaw-admin.sock"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv, *NO_DAEMON])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def error_doc(out: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(out)
    return dict(doc["error"])


@pytest.mark.parametrize("value", ["-5", "0", "10001", "99999999999999999999999", "ten", "1e3"])
def test_line_count_out_of_range_is_a_usage_error_naming_the_range(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    code, out, err = run(capsys, "session", "logs", "abcdefgh", "-n", value)
    assert code == exitcodes.USAGE
    assert out == ""
    assert err.strip() == (
        "ironctl session logs: argument -n/--lines: expected an integer from 1 to 10000, "
        f"got '{value}'"
    )


@pytest.mark.parametrize(
    ("option", "value"), [("--limit", "-1"), ("--limit", "10001"), ("--after", "-1"),
                          ("--after", str(2**63))],
)  # fmt: skip
def test_audit_numbers_out_of_range_are_usage_errors(
    capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    code, _out, err = run(capsys, "audit", "list", option, value)
    assert code == exitcodes.USAGE
    assert f"argument {option}: expected an integer from" in err


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "-1", "0", "1e999", "86401", "soon"])
def test_timeouts_must_be_finite_and_positive(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    code, out, err = run(capsys, "--json", "status", f"--timeout={value}")
    assert code == exitcodes.USAGE
    assert err == ""
    assert error_doc(out) == {
        "code": "USAGE",
        "message": "ironctl status: argument --timeout: expected seconds, a number above 0 and "
        f"at most 86400, got '{value}'",
        "exit": exitcodes.USAGE,
    }


def test_a_sane_timeout_reaches_the_socket(capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run(capsys, "status", "--timeout", "0.5")
    assert code == exitcodes.UNAVAILABLE
    assert "does not exist" in err


@pytest.mark.parametrize(
    ("arg", "shown"),
    [
        ("ab\udcffcd", "ab\\xffcd"),
        ("\udced\udca0\udc80", "\\xed\\xa0\\x80"),
        ("x\ud800", "x\\ud800"),
    ],
)
def test_arguments_that_are_not_utf8_are_refused_naming_them(
    capsys: pytest.CaptureFixture[str], arg: str, shown: str
) -> None:
    # Non-UTF-8 bytes in argv reach Python as surrogates (surrogateescape).
    code, out, err = run(capsys, "session", "show", arg)
    assert code == exitcodes.USAGE
    assert out == ""
    assert err.strip() == f"ironctl: argument 3 ('{shown}') is not valid UTF-8 text"
    err.encode("utf-8")  # printable: no surrogate reached the terminal


def stdin_bytes(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


@pytest.mark.parametrize(
    "argv",
    [
        ["send", "abcdefgh", "-"],
        ["change", "submit", "--kind", "persona", "--agent", "demo", "--payload", "-"],
    ],
)
def test_stdin_that_is_not_utf8_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    stdin_bytes(monkeypatch, b"hello \xc3\x28 world")
    code, out, _err = run(capsys, "--json", *argv)
    assert code == exitcodes.INVALID
    assert error_doc(out) == {
        "code": "INVALID_INPUT",
        "message": "standard input is not UTF-8 text: byte 0xc3 at offset 6",
        "exit": exitcodes.INVALID,
    }


class ClosedPipe(io.StringIO):
    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize(
    "argv", [["--help"], ["session", "logs", "--help"], ["--json", "status", "--timeout", "nan"]]
)
def test_a_closed_pipe_ends_quietly_with_141(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    monkeypatch.setattr("sys.stdout", ClosedPipe())
    assert main(argv) == exitcodes.PIPE_CLOSED
    assert capsys.readouterr().err == ""


class ClosedTerminal(ClosedPipe):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stdout", [ClosedPipe, ClosedTerminal])
def test_a_closed_pipe_under_a_table_ends_with_141_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, stdout: type[ClosedPipe]
) -> None:
    # rich (the table on a terminal) turns a closed pipe into a silent exit 1 unless told
    # otherwise; plain columns off a terminal are print()s.
    def listing(args: Any, stub: Any) -> int:
        render.sessions([])
        return exitcodes.OK

    monkeypatch.setattr(sessions, "cmd_list", listing)
    monkeypatch.setattr("sys.stdout", stdout())
    assert main(["session", "list"]) == exitcodes.PIPE_CLOSED
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("flag", ["--json", "--jso", "--js"])
def test_usage_errors_are_json_under_json(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    code, out, err = run(capsys, flag, "session", "frobnicate")
    assert code == exitcodes.USAGE
    assert err == ""
    doc = error_doc(out)
    assert doc["code"] == "USAGE"
    assert doc["exit"] == exitcodes.USAGE
    assert "invalid choice: 'frobnicate'" in doc["message"]


def test_usage_errors_in_the_command_itself_are_json_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _err = run(capsys, "chat", "--json")
    assert code == exitcodes.USAGE
    assert error_doc(out)["message"] == "ironctl chat: give a session id or --agent NAME"


def test_control_sequences_in_echoed_arguments_are_made_visible(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _out, err = run(capsys, "status", "\x1b[2J\x1b]0;pwned\x07", "\u202eevil")
    assert code == exitcodes.USAGE
    assert "\x1b" not in err
    assert "\x07" not in err
    assert "\u202e" not in err
    assert "\\x1b[2J\\x1b]0;pwned\\x07 \\u202eevil" in err


def test_a_10kb_argument_is_echoed_cut(capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run(capsys, "session", "logs", "abcdefgh", "-n", "9" * 10_000)
    assert code == exitcodes.USAGE
    assert len(err) < 300
    assert "(10000 characters)" in err


def test_an_unexpected_exception_is_one_line_and_exit_9(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(command: str | None = None) -> None:
        raise RuntimeError("boom \x1b[31m")

    monkeypatch.setattr(ctl_main, "build_parser", broken)
    monkeypatch.delenv("IRONCTL_DEBUG", raising=False)
    code, out, err = run(capsys, "status")
    assert code == exitcodes.INTERNAL
    assert out == ""
    assert err == (
        "ironctl: internal error in ironctl: RuntimeError: boom \\x1b[31m "
        "(set IRONCTL_DEBUG=1 for a traceback)\n"
    )
    code, out, _err = run(capsys, "status", "--json")
    assert error_doc(out)["code"] == "IRONCTL_INTERNAL"


def test_ironctl_debug_shows_the_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(command: str | None = None) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(ctl_main, "build_parser", broken)
    monkeypatch.setenv("IRONCTL_DEBUG", "1")
    assert main(["status"]) == exitcodes.INTERNAL
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize("command", commands(), ids=lambda c: c.name)
def test_every_command_reports_usage_errors_as_json(
    capsys: pytest.CaptureFixture[str], command: Any
) -> None:
    argv = [*command.words, "--json", "--timeout", "nan", "--no-such-option"]
    code, out, err = run(capsys, *argv)
    assert code == exitcodes.USAGE
    assert err == ""
    assert error_doc(out)["exit"] == exitcodes.USAGE


@pytest.mark.parametrize("command", commands(), ids=lambda c: c.name)
def test_every_command_has_help(capsys: pytest.CaptureFixture[str], command: Any) -> None:
    code, out, _err = run(capsys, *command.words, "--help")
    assert code == exitcodes.OK
    assert "exit codes:" in out


# Every exit code ironctl may end with: the named ones, each listed in --help.
DOCUMENTED = {v for k, v in vars(exitcodes).items() if k.isupper() and type(v) is int}
# Commands that never ask the daemon, or (skill add) read a local folder before asking it.
OFFLINE = {"containment verify", "skill sign", "skill manifest", "skill verify", "skill add"}


def test_every_named_exit_code_is_in_the_help() -> None:
    for code in DOCUMENTED:
        assert f" {code} " in f" {exitcodes.HELP} ".replace("\n", " "), code


def valid_argv(command: Any) -> list[str]:
    """Arguments the command accepts, so that it gets as far as asking the daemon."""
    choices = dict(command.choices)
    argv = [*command.words]
    argv += ["abcdefgh"] * (len(command.positionals) + len(command.optional_positionals))
    for option in command.required:
        argv += [option, choices[option][0] if option in choices else "demo"]
    return argv


@pytest.fixture(params=["missing", "refusing"])
def dead_socket(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A socket path where no daemon listens: no file at all, or a socket nobody accepts on."""
    path = tmp_path / "admin.sock"
    if request.param == "missing":
        yield str(path)
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(str(path))  # bound, never listening: connect() is refused
        yield str(path)


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("command", commands(), ids=lambda c: c.name)
def test_every_command_without_a_daemon_is_one_documented_error(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    dead_socket: str,
    command: Any,
    as_json: bool,
) -> None:
    stdin_bytes(monkeypatch, b"hello\n")  # send -, chat: a line to send
    argv = [*valid_argv(command), "--socket", dead_socket, "--timeout", "5"]
    code = main([*argv, "--json"] if as_json else argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code in DOCUMENTED, (code, out, err)
    assert code != exitcodes.OK, (code, out, err)
    if command.name not in OFFLINE:
        assert code == exitcodes.UNAVAILABLE, (code, out, err)
        assert dead_socket in out + err
    if as_json:
        assert err == ""
        doc = json.loads(out)  # one document, nothing else on stdout
        assert doc["error"]["exit"] == code
        assert isinstance(doc["error"]["code"], str)
        assert isinstance(doc["error"]["message"], str)
    else:
        assert out == ""
        assert err.count("\n") <= 2, err
        assert err.startswith("ironctl: "), err


@pytest.mark.parametrize("command", commands(), ids=lambda c: c.name)
def test_every_command_with_bad_arguments_is_one_usage_line(
    capsys: pytest.CaptureFixture[str], command: Any
) -> None:
    code, out, err = run(capsys, *command.words, "--timeout", "nan", "--no-such-option")
    assert code == exitcodes.USAGE
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("ironctl"), err


class NoReplyStub:
    """A daemon that queues the message, then closes the reply stream without the reply."""

    def __init__(self, channel: Any) -> None:
        pass

    def SendMessage(self, request: Any, timeout: float) -> admin_pb2.SendMessageResponse:
        return admin_pb2.SendMessageResponse(seq=7, replies_before=3)

    def WatchReplies(self, request: Any, timeout: float) -> Iterator[Any]:
        yield admin_pb2.WatchRepliesResponse(reply=admin_pb2.Reply(seq=4, in_reply_to=6))


@pytest.mark.parametrize("argv", [["send", "abcdefgh", "hi"], ["chat", "abcdefgh"]])
def test_a_reply_stream_that_ends_early_is_a_clear_failure(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    monkeypatch.setattr(rpc, "stub_for", NoReplyStub)
    stdin_bytes(monkeypatch, b"hi\n")
    code, out, err = run(capsys, *argv)
    assert code == exitcodes.FAILED
    assert err.startswith(
        f"ironctl: {argv[0]}: session abcdefgh: the reply stream ended before the reply to "
        "message 7 "
    ), err
    stdin_bytes(monkeypatch, b"hi\n")
    code, out, _err = run(capsys, *argv, "--json")
    assert error_doc(out)["code"] == "NO_REPLY"
    assert code == exitcodes.FAILED
