"""``ironctl send --client-id ID`` makes a retry safe: each run made a random client id, so a
send re-run after a failure reached the agent twice (found by the review of multi-step
commands, stop 50). With the same id the daemon queues the message once and answers the first
one's seq (``duplicate``); ironctl then looks for that message's reply from the start, since it
may be in already. A bad id is a usage error before anything is sent. Over the real transport
the daemon's side is ``store/queues.py`` ``append`` (tests/integration/test_messages.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, rpc, wire
from ironclawd.ctl.main import main

NO_DAEMON = ["--socket", "/nonexistent/ironclaw-admin.sock"]
SID = "abcdefgh0001"


class Stub:
    """A daemon that de-duplicates by client id: the first message is seq 4, answered."""

    seen: ClassVar[dict[str, int]] = {}
    watched_from: ClassVar[list[int]] = []

    def __init__(self, channel: Any) -> None:
        pass

    def SendMessage(self, request: Any, timeout: float) -> admin_pb2.SendMessageResponse:
        if request.client_id in Stub.seen:
            return admin_pb2.SendMessageResponse(seq=4, duplicate=True, replies_before=9)
        Stub.seen[request.client_id] = 4
        return admin_pb2.SendMessageResponse(seq=4, replies_before=3)

    def WatchReplies(self, request: Any, timeout: float) -> Iterator[Any]:
        Stub.watched_from.append(request.after_seq)
        replies = [(2, 3), (4, 4), (5, 9)]  # (reply seq, in reply to)
        for seq, to in replies:
            if seq > request.after_seq:
                yield admin_pb2.WatchRepliesResponse(
                    reply=admin_pb2.Reply(seq=seq, in_reply_to=to, text=f"answer to {to}")
                )


@pytest.fixture(autouse=True)
def stub(monkeypatch: pytest.MonkeyPatch) -> None:
    Stub.seen, Stub.watched_from = {}, []
    monkeypatch.setattr(rpc, "stub_for", Stub)


def send(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, Any]]:
    code = main(["--json", "send", SID, "hi", *extra, *NO_DAEMON])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def test_a_retry_with_the_same_id_is_queued_once_and_prints_the_first_reply(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, first = send(capsys, "--client-id", "job-17:try")
    assert code == exitcodes.OK
    assert first["reply"]["text"] == "answer to 4"
    code, again = send(capsys, "--client-id", "job-17:try")
    assert code == exitcodes.OK
    assert again["reply"]["text"] == "answer to 4"  # before: waited past it, until the timeout
    assert Stub.watched_from == [3, 0]
    assert list(Stub.seen) == ["job-17:try"]


@pytest.mark.parametrize("bad", ["", "a b", "x" * 65, "é"])
def test_a_bad_id_is_a_usage_error_before_anything_is_sent(
    capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    code = main(["send", SID, "hi", "--client-id", bad, *NO_DAEMON])
    assert code == exitcodes.USAGE
    assert "expected 1-64 characters" in capsys.readouterr().err
    assert Stub.seen == {}


def test_a_repeated_id_says_nothing_new_was_queued(capsys: pytest.CaptureFixture[str]) -> None:
    """The daemon matches the id alone, not the text: an id used again (a script's fixed one)
    with other words printed the first message's reply, or "queued as message 4", as if these
    words had been queued and answered."""
    assert main(["send", SID, "hi", "--client-id", "daily", *NO_DAEMON]) == exitcodes.OK
    capsys.readouterr()
    assert main(["send", SID, "bye", "--client-id", "daily", *NO_DAEMON]) == exitcodes.OK
    out, err = capsys.readouterr()
    assert out == "answer to 4\n"
    assert "client id daily was used before, for message 4: nothing new queued" in err, err
    argv = ["send", SID, "bye", "--client-id", "daily", "--no-wait", *NO_DAEMON]
    assert main(argv) == exitcodes.OK
    out, err = capsys.readouterr()
    assert "queued as message 4" not in out, out
    assert "nothing new queued" in err + out


def test_a_repeated_ids_failed_wait_points_at_a_reply_already_in(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A duplicate's replies_before is counted now, past the first message's reply: the way to
    read it that a failed wait prints must look from the start, as the wait itself does."""

    class Cut(Stub):
        def WatchReplies(self, request: Any, timeout: float) -> Iterator[Any]:
            Stub.watched_from.append(request.after_seq)
            raise wire.RpcError(wire.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    Stub.seen["job-18"] = 4
    monkeypatch.setattr(rpc, "stub_for", Cut)
    code = main(["send", SID, "hi", "--client-id", "job-18", *NO_DAEMON])
    err = capsys.readouterr().err
    assert code == exitcodes.TIMEOUT, err
    assert Stub.watched_from == [0]
    assert "message 4 is queued" in err, err
    assert "after_seq" not in err, err  # 9 would skip the reply to message 4 (seq 4)
