"""A non-member of the admin group holds at most one connection (``peer.Shares``), but every
call on it was refused with a journal line of its own, the one refusal not throttled: one
connection made lines without end, and journald's rate limit would then drop the daemon's own
(found by a review). Over real gRPC on Unix sockets, the real front and interceptor."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ironclawd import ratelog
from ironclawd.api import peer
from ironclawd.api.auth import CallerInterceptor
from ironclawd.api.peer import Caller, PeerFront, PeerRegistry

MALLORY = Caller(uid=1002, gid=1002, pid=42, groups=(), user_name="mallory", authorized=False)
CALLS = 200


def test_a_non_members_refusals_reach_the_journal_at_a_bounded_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(peer, "read_peer", lambda sock, gid: MALLORY)
    monkeypatch.setattr(ratelog, "AGENT_LOG", ratelog.LogThrottle(per_window=5))
    caplog.set_level(logging.WARNING, logger="ironclawd.admin")

    async def go() -> int:
        registry = PeerRegistry()
        server = grpc.aio.server(
            interceptors=[CallerInterceptor(registry, "ironclaw-admin", 30.0, 128)]
        )
        health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)
        internal = tmp_path / "internal.sock"
        assert server.add_insecure_port(f"unix:{internal}")
        await server.start()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(tmp_path / "admin.sock"))
        listener.listen(16)
        listener.setblocking(False)
        front = PeerFront(listener, internal, registry, 0, max_connections=64)
        await front.start()
        denied = 0
        try:
            async with grpc.aio.insecure_channel(f"unix:{tmp_path / 'admin.sock'}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                for _ in range(CALLS):
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await stub.Check(health_pb2.HealthCheckRequest())
                    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
                    denied += 1
        finally:
            await front.close()
            await server.stop(0)
        return denied

    assert asyncio.run(go()) == CALLS
    lines = [r for r in caplog.records if "not in group" in r.getMessage()]
    assert 1 <= len(lines) <= 5  # before: one per call, 200
