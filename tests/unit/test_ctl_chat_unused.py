"""``ironctl chat --agent A`` starts a session; one that ended before anything was said in it
(end of input, Ctrl-C at the first prompt) was left running, a pooled sandbox taken for every
such run (``ironctl chat --agent demo </dev/null``; found by a review, stop 50). It is removed
now; a session named on the command line, or one a message went to, is left as it is."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, rpc, wire
from ironclawd.ctl.main import main

NO_DAEMON = ["--socket", "/nonexistent/ironclaw-admin.sock"]


class Stub:
    calls: ClassVar[list[str]] = []

    def __init__(self, channel: Any) -> None:
        pass

    def CreateSession(self, request: Any, timeout: float) -> admin_pb2.CreateSessionResponse:
        Stub.calls.append("create")
        return admin_pb2.CreateSessionResponse(session=admin_pb2.Session(sid="abcdefgh0009"))

    def SendMessage(self, request: Any, timeout: float) -> admin_pb2.SendMessageResponse:
        Stub.calls.append("send")
        return admin_pb2.SendMessageResponse(seq=1)

    def WatchReplies(self, request: Any, timeout: float) -> Iterator[Any]:
        yield admin_pb2.WatchRepliesResponse(reply=admin_pb2.Reply(seq=1, in_reply_to=1, text="hi"))

    def GetSession(self, request: Any, timeout: float) -> admin_pb2.GetSessionResponse:
        return admin_pb2.GetSessionResponse(session=admin_pb2.Session(sid=request.sid))

    def RemoveSession(self, request: Any, timeout: float) -> admin_pb2.RemoveSessionResponse:
        Stub.calls.append(
            f"remove {request.sid} force={request.force} only_if_unused={request.only_if_unused}"
        )
        return admin_pb2.RemoveSessionResponse()


@pytest.fixture(autouse=True)
def stub(monkeypatch: pytest.MonkeyPatch) -> None:
    Stub.calls = []
    monkeypatch.setattr(rpc, "stub_for", Stub)


def chat(monkeypatch: pytest.MonkeyPatch, stdin: bytes, *argv: str) -> int:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    return main(["chat", *argv, *NO_DAEMON])


def test_a_session_chat_started_and_nothing_was_said_in_is_removed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert chat(monkeypatch, b"\n  \n", "--agent", "demo") == exitcodes.OK
    assert Stub.calls == ["create", "remove abcdefgh0009 force=True only_if_unused=True"]
    assert "nothing was sent: removed session abcdefgh0009" in capsys.readouterr().err


def test_a_session_a_message_went_to_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    assert chat(monkeypatch, b"hello\n", "--agent", "demo") == exitcodes.OK
    assert Stub.calls == ["create", "send"]


def test_a_session_named_on_the_command_line_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    assert chat(monkeypatch, b"", "abcdefgh0001") == exitcodes.OK
    assert Stub.calls == []


def test_a_session_someone_else_sent_a_message_to_meanwhile_stays(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its id is in ironctl session list from the start: another operator's ironctl send (or an
    admitted held message) went to it while this chat sat at its prompt. Removing it would
    destroy her conversation, queues and all."""

    class Used(Stub):
        def CreateSession(self, request: Any, timeout: float) -> Any:
            Stub.calls.append("create")
            made = admin_pb2.Session(sid="abcdefgh0009", created_at=100.0, last_active_at=100.0)
            return admin_pb2.CreateSessionResponse(session=made)

        def GetSession(self, request: Any, timeout: float) -> admin_pb2.GetSessionResponse:
            Stub.calls.append("get")
            now = admin_pb2.Session(sid=request.sid, created_at=100.0, last_active_at=160.0)
            return admin_pb2.GetSessionResponse(session=now)

    monkeypatch.setattr(rpc, "stub_for", Used)
    assert chat(monkeypatch, b"", "--agent", "demo") == exitcodes.OK
    assert not [c for c in Stub.calls if c.startswith("remove")], Stub.calls
    assert "kept" in capsys.readouterr().err


def test_a_session_the_daemon_finds_a_message_was_queued_to_is_kept(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A send that came between chat's read of the activity and its removal: the daemon, asked
    to remove the session only if no message was ever queued to it, refuses; chat keeps it and
    says so (before: removed with force, the message its sender was told is queued with it)."""

    class Refusing(Stub):
        def RemoveSession(self, request: Any, timeout: float) -> Any:
            super().RemoveSession(request, timeout)
            raise wire.RpcError(
                wire.StatusCode.FAILED_PRECONDITION,
                f"session {request.sid} has had messages queued to it: not removed",
            )

    monkeypatch.setattr(rpc, "stub_for", Refusing)
    assert chat(monkeypatch, b"", "--agent", "demo") == exitcodes.OK
    assert Stub.calls == ["create", "remove abcdefgh0009 force=True only_if_unused=True"]
    err = capsys.readouterr().err
    assert (
        "ironctl chat: nothing was sent from here, but session abcdefgh0009 is kept: session "
        "abcdefgh0009 has had messages queued to it: not removed"
    ) in err
    assert "removed session" not in err
