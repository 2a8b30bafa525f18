"""``ironctl send`` and ``ironctl chat`` are two steps: the message is queued (SendMessage), then
its reply is awaited (WatchReplies). A failure of the second step came out as the daemon's bare
status ("deadline_exceeded: Deadline Exceeded"), which does not say that the message was queued:
the operator sent it again and the agent got it twice (each run of ironctl makes a new client
id, so the daemon cannot tell a re-run from a new message). Now such a failure keeps its status
and exit code and names the queued message, says not to send it again and how to read its reply;
a send whose own answer timed out says that whether it was queued is not known."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, rpc, wire
from ironclawd.ctl.main import main

NO_DAEMON = ["--socket", "/nonexistent/ironclaw-admin.sock"]
SID = "abcdefgh0001"


class QueuedStub:
    """A daemon that queues the message as seq 7 (after reply 3), then fails the watch."""

    watch_error = wire.RpcError(wire.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    send_error: BaseException | None = None

    def __init__(self, channel: Any) -> None:
        pass

    def SendMessage(self, request: Any, timeout: float) -> admin_pb2.SendMessageResponse:
        if self.send_error is not None:
            raise self.send_error
        return admin_pb2.SendMessageResponse(seq=7, replies_before=3)

    def WatchReplies(self, request: Any, timeout: float) -> Iterator[Any]:
        yield admin_pb2.WatchRepliesResponse(reply=admin_pb2.Reply(seq=3, in_reply_to=5))
        raise self.watch_error


def _run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, stub: type, *argv: str
) -> tuple[int, str, str]:
    monkeypatch.setattr(rpc, "stub_for", stub)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"hi\nsecond\n")))
    code = main([*argv, *NO_DAEMON])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


COMMANDS = [["send", SID, "hi"], ["send", SID, "-"], ["chat", SID]]


@pytest.mark.parametrize(
    ("status", "exit_code"),
    [
        (wire.StatusCode.DEADLINE_EXCEEDED, exitcodes.TIMEOUT),
        (wire.StatusCode.UNAVAILABLE, exitcodes.UNAVAILABLE),
        (wire.StatusCode.PERMISSION_DENIED, exitcodes.PERMISSION),
    ],
)
@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_failed_wait_for_the_reply_names_the_queued_message(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    status: wire.StatusCode,
    exit_code: int,
) -> None:
    class Stub(QueuedStub):
        watch_error = wire.RpcError(status, "the daemon's words")

    code, out, err = _run(capsys, monkeypatch, Stub, *argv)
    assert code == exit_code, (code, out, err)
    assert err.count("\n") == 1, err
    assert "the daemon's words" in err
    assert f"message 7 is queued to session {SID}" in err, err
    assert "do not send it again" in err
    # How to read the reply when it comes: the stream of replies after the last one seen.
    assert f'ironctl api call WatchReplies \'{{"sid": "{SID}", "after_seq": 3}}\'' in err, err
    code, out, err = _run(capsys, monkeypatch, Stub, *argv, "--json")
    assert code == exit_code
    doc = json.loads(out)["error"]
    assert doc["code"] == status.name
    assert doc["exit"] == exit_code
    assert "message 7 is queued" in doc["message"]
    assert err == ""


@pytest.mark.parametrize(
    ("status", "words", "exit_code"),
    [
        (wire.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", exitcodes.TIMEOUT),
        (wire.StatusCode.UNAVAILABLE, "Socket closed", exitcodes.UNAVAILABLE),
        (wire.StatusCode.INTERNAL, "the control socket failed", exitcodes.INTERNAL),
    ],
)
@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_send_without_an_answer_says_whether_it_was_queued_is_not_known(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    status: wire.StatusCode,
    words: str,
    exit_code: int,
) -> None:
    class Stub(QueuedStub):
        send_error = wire.RpcError(status, words)

    code, out, err = _run(capsys, monkeypatch, Stub, *argv)
    assert (code, out) == (exit_code, ""), (code, out, err)
    assert err.count("\n") == 1, err
    assert words in err
    assert f"may or may not have been queued to session {SID}" in err, err
    assert f'ironctl api call WatchReplies \'{{"sid": "{SID}"}}\'' in err, err


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_refused_send_is_the_daemons_error_alone(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    # Refused outright, or never sent: nothing was queued, and nothing says it may have been.
    class Refused(QueuedStub):
        send_error = wire.RpcError(wire.StatusCode.NOT_FOUND, "session abcdefgh0001: not found")

    code, out, err = _run(capsys, monkeypatch, Refused, *argv)
    assert (code, out) == (exitcodes.NOT_FOUND, "")
    assert err == f"ironctl: {argv[0]}: not_found: session abcdefgh0001: not found\n"

    class NotSent(QueuedStub):
        send_error = wire.RpcError(wire.StatusCode.UNAVAILABLE, "connect to unix:/x: refused")

    code, out, err = _run(capsys, monkeypatch, NotSent, *argv)
    assert (code, out) == (exitcodes.UNAVAILABLE, "")
    assert "queued" not in err


def test_a_long_status_message_never_cuts_off_what_was_queued(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Stub(QueuedStub):
        watch_error = wire.RpcError(wire.StatusCode.INTERNAL, "x" * 5000)

    code, _out, err = _run(capsys, monkeypatch, Stub, "send", SID, "hi")
    assert code == exitcodes.INTERNAL
    assert "message 7 is queued" in err
    assert err.rstrip().endswith('\'{"sid": "abcdefgh0001", "after_seq": 3}\''), err[-200:]


class Interrupted(QueuedStub):
    """Ctrl-C while the reply is awaited."""

    watch_error = KeyboardInterrupt()  # type: ignore[assignment]


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_ctrl_c_while_the_reply_is_awaited_names_the_queued_message(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    code, out, err = _run(capsys, monkeypatch, Interrupted, *argv)
    assert (code, out) == (exitcodes.INTERRUPTED, "")
    assert f"message 7 is queued to session {SID}" in err, err
    assert "do not send it again" in err
    assert f'ironctl api call WatchReplies \'{{"sid": "{SID}", "after_seq": 3}}\'' in err, err


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_ctrl_c_while_the_send_is_answered_says_whether_it_was_queued_is_not_known(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    class Stub(QueuedStub):
        send_error = KeyboardInterrupt()

    code, out, err = _run(capsys, monkeypatch, Stub, *argv)
    assert (code, out) == (exitcodes.INTERRUPTED, "")
    assert f"may or may not have been queued to session {SID}" in err, err


def test_ctrl_c_at_the_prompt_says_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Stdin:
        buffer = type("B", (), {"readline": staticmethod(lambda: (_ for _ in ()).throw(
            KeyboardInterrupt()))})()  # fmt: skip

        def isatty(self) -> bool:
            return False

    monkeypatch.setattr(rpc, "stub_for", Interrupted)
    monkeypatch.setattr("sys.stdin", Stdin())
    assert main(["chat", SID, *NO_DAEMON]) == exitcodes.INTERRUPTED
    assert capsys.readouterr() == ("", "")
