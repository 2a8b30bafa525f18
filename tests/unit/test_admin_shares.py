"""The admin API's connections and calls in flight are shared out per user (stop 47's review):
one member of the admin group holding every connection, or every call the server takes at
once, locked everyone else out, root included. A user other than root holds at most a quarter,
all of them together leave an eighth to root, and a caller outside the group holds one."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ironclawd.api import peer
from ironclawd.api.auth import CallerInterceptor
from ironclawd.api.peer import Caller, PeerFront, PeerRegistry, Shares


def _caller(uid: int, authorized: bool = True) -> Caller:
    return Caller(uid=uid, gid=uid, pid=42, groups=(), user_name=f"u{uid}", authorized=authorized)


ROOT, ALICE, BOB, MALLORY = _caller(0), _caller(1000), _caller(1001), _caller(1002, False)


def test_a_member_holds_a_quarter_and_root_keeps_an_eighth() -> None:
    shares = Shares(64)
    assert all(shares.take(ALICE) is None for _ in range(16))
    assert shares.take(ALICE) == "uid 1000 holds 16, its most"
    for uid in range(2000, 2003):  # more members fill what is not kept for root: 16+16+8
        for _ in range(16):
            shares.take(_caller(uid))
    assert shares.held(2002) == 8
    assert shares.take(BOB) == "56 of 64 in use; the rest is kept for root"
    shares.give(ALICE)
    assert shares.take(BOB) is None  # what one gives back, another may take
    assert shares.held(ALICE.uid) == 15
    assert all(shares.take(ROOT) is None for _ in range(8))
    assert shares.take(ROOT) == "all 64 in use"


def test_a_caller_outside_the_group_holds_one() -> None:
    shares = Shares(64)
    assert shares.take(MALLORY) is None
    assert shares.take(MALLORY) == "uid 1002 holds 1, its most"
    shares.give(MALLORY)
    assert shares.held(MALLORY.uid) == 0
    assert shares.take(MALLORY) is None


def test_a_small_limit_still_lets_each_user_in() -> None:
    shares = Shares(1)
    assert shares.take(ALICE) is None
    assert shares.take(ROOT) == "all 1 in use"


@pytest.fixture
def internal(tmp_path: Path) -> Iterator[Path]:
    """A stand-in for the internal gRPC server: accepts and holds connections."""
    path = tmp_path / "internal.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(64)
    yield path
    server.close()


def test_the_front_refuses_a_members_connection_past_its_share_and_root_gets_in(
    tmp_path: Path, internal: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    who: list[Caller] = []
    monkeypatch.setattr(peer, "read_peer", lambda sock, gid: who.pop(0))

    async def go() -> None:
        public = tmp_path / "admin.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(public))
        listener.listen(64)
        listener.setblocking(False)
        front = PeerFront(listener, internal, PeerRegistry(), 0, max_connections=8)
        await front.start()
        loop = asyncio.get_running_loop()

        async def connect(caller: Caller) -> socket.socket:
            who.append(caller)
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.setblocking(False)
            await loop.sock_connect(client, str(public))
            await asyncio.sleep(0.05)
            return client

        async def closed(client: socket.socket) -> bool:
            try:
                return await asyncio.wait_for(loop.sock_recv(client, 1), 0.2) == b""
            except TimeoutError:
                return False

        held = [await connect(ALICE), await connect(ALICE)]  # a quarter of 8
        assert not any([await closed(c) for c in held])
        refused = await connect(ALICE)
        assert await closed(refused)
        root = await connect(ROOT)
        assert not await closed(root)
        assert front.shares.held(ALICE.uid) == 2
        held[0].close()
        await asyncio.sleep(0.05)
        assert front.shares.held(ALICE.uid) == 1  # given back when the connection ends
        for client in [*held, refused, root]:
            client.close()
        await front.close()

    asyncio.run(go())


def test_a_members_calls_in_flight_are_capped_and_roots_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over real gRPC: the interceptor shares out the server's calls in flight. A member's
    third watch of 8 is refused RESOURCE_EXHAUSTED, root's call runs, and a watch that ends
    gives its share back."""
    who: list[Caller] = []
    monkeypatch.setattr(peer, "read_peer", lambda sock, gid: who.pop(0))

    async def go() -> None:
        registry = PeerRegistry()
        interceptor = CallerInterceptor(registry, "ironclaw-admin", 30.0, max_calls=8)
        server = grpc.aio.server(interceptors=[interceptor], maximum_concurrent_rpcs=8)
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        internal = tmp_path / "internal.sock"
        assert server.add_insecure_port(f"unix:{internal}")
        await server.start()
        public = tmp_path / "admin.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(public))
        listener.listen(16)
        listener.setblocking(False)
        front = PeerFront(listener, internal, registry, 0, max_connections=16)
        await front.start()

        def channel(caller: Caller) -> grpc.aio.Channel:
            who.append(caller)
            # A channel of its own, not one sharing another's connection (grpc's global pool).
            return grpc.aio.insecure_channel(
                f"unix:{public}", options=[("grpc.use_local_subchannel_pool", 1)]
            )

        alice = channel(ALICE)
        stub = health_pb2_grpc.HealthStub(alice)
        watches = [stub.Watch(health_pb2.HealthCheckRequest()) for _ in range(3)]
        codes = []
        for watch in watches:
            try:
                await asyncio.wait_for(watch.read(), 2)
                codes.append("OK")
            except grpc.aio.AioRpcError as err:
                codes.append(err.code().name)
        assert sorted(codes) == ["OK", "OK", "RESOURCE_EXHAUSTED"]
        async with channel(ROOT) as root:
            reply = await health_pb2_grpc.HealthStub(root).Check(health_pb2.HealthCheckRequest())
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        for watch in watches:
            watch.cancel()
        await asyncio.sleep(0.2)
        assert interceptor.calls.held(ALICE.uid) == 0
        reply = await stub.Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        await alice.close(None)
        await front.close()
        await server.stop(0)

    asyncio.run(go())
