"""A backlog answered faster than ``[sockets] calls_per_second`` (issue 17): the host refuses
the agent's extra model calls with a "call again in N ms" trailer and the agent waits and calls
again, so every message gets the model's answer; before, the user got "[I cannot answer now:
too many calls: slow down]". The rate is set low here so that a short backlog outruns it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from tests.harness.agents import unlimited_agent
from tests.harness.private_systemd import SystemdHarness

pytestmark = pytest.mark.integration

SOCKET = "/run/ironclaw/admin.sock"
CONFIG = "/etc/ironclaw/ironclawd.toml"
AGENT = "paced"
# Four calls a second, bursts of eight: 24 messages queued at once outrun it three times over.
CONFIG_TEXT = unlimited_agent(AGENT) + "\n[sockets]\ncalls_per_second = 4.0\n"
MESSAGES = 24
RPC_TIMEOUT = 60.0


def out(proc: Any) -> str:
    return (proc.stdout or b"").decode(errors="replace") + (proc.stderr or b"").decode(
        errors="replace"
    )


@pytest.fixture(scope="module")
def stub(daemon: SystemdHarness) -> Iterator[admin_pb2_grpc.AdminServiceStub]:
    daemon.run(["tee", CONFIG], input=CONFIG_TEXT.encode(), check=True)
    proc = daemon.run(["systemctl", "restart", "ironclawd.service"], timeout=120)
    assert proc.returncode == 0, out(proc)
    try:
        with grpc.insecure_channel(f"unix:{daemon.host_path(SOCKET)}") as channel:
            yield admin_pb2_grpc.AdminServiceStub(channel)
    finally:
        proc = daemon.run(
            ["bash", "-c", f"rm -f {CONFIG}; systemctl reset-failed ironclawd; "
             "systemctl restart ironclawd"], timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, out(proc)


def test_a_backlog_over_the_call_rate_is_answered_by_the_model(
    daemon: SystemdHarness, stub: admin_pb2_grpc.AdminServiceStub
) -> None:
    since = time.time()
    sid = stub.CreateSession(
        admin_pb2.CreateSessionRequest(agent=AGENT), timeout=RPC_TIMEOUT
    ).session.sid
    try:
        sent = [
            stub.SendMessage(
                admin_pb2.SendMessageRequest(sid=sid, text=f"m{i}", client_id=f"c{i}"),
                timeout=RPC_TIMEOUT,
            ).seq
            for i in range(MESSAGES)
        ]
        request = admin_pb2.WatchRepliesRequest(sid=sid, after_seq=0, follow=True)
        replies: list[admin_pb2.Reply] = []
        call = stub.WatchReplies(request, timeout=120)
        try:
            for item in call:
                replies.append(item.reply)
                if len(replies) == MESSAGES:
                    break
        finally:
            call.cancel()
        assert [(r.in_reply_to, r.text) for r in replies] == [
            (seq, f"mock: m{i}") for i, seq in enumerate(sent)
        ]
        # The meter did hold the agent back (else this test shows nothing).
        journal = daemon.run(
            ["journalctl", "-u", "ironclawd", "--no-pager", "-o", "cat", "--since", f"@{since:.0f}"]
        )
        assert "refused: over 4 calls a second" in out(journal), out(journal)[-2000:]
    finally:
        stub.RemoveSession(admin_pb2.RemoveSessionRequest(sid=sid, force=True), timeout=RPC_TIMEOUT)
