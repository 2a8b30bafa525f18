from __future__ import annotations

from ironclawd.api.peer import Caller, PeerRegistry


def _caller(uid: int = 1000) -> Caller:
    return Caller(uid=uid, gid=uid, pid=42, groups=(), user_name="alice", authorized=True)


def test_resolve_maps_bound_abstract_address_to_caller() -> None:
    registry = PeerRegistry()
    nonce = registry.register(_caller())
    assert registry.resolve(f"unix-abstract:ironclaw-peer/{nonce}") == _caller()


def test_nonces_are_unpredictable_and_unique() -> None:
    registry = PeerRegistry()
    nonces = {registry.register(_caller(i)) for i in range(200)}
    assert len(nonces) == 200
    assert all(len(n) == 32 for n in nonces)


def test_unknown_or_forged_peers_resolve_to_nobody() -> None:
    registry = PeerRegistry()
    nonce = registry.register(_caller())
    for peer in (
        "unix:",
        "unix:/run/ironclaw/admin.sock",
        f"unix:ironclaw-peer/{nonce}",  # a path, not the abstract address the daemon bound
        "unix-abstract:ironclaw-peer/0",
        f"unix-abstract:other/{nonce}",
        "ipv4:127.0.0.1:5000",
        "",
    ):
        assert registry.resolve(peer) is None, peer


def test_forget_revokes() -> None:
    registry = PeerRegistry()
    nonce = registry.register(_caller())
    registry.forget(nonce)
    assert registry.resolve(f"unix-abstract:ironclaw-peer/{nonce}") is None
    assert len(registry) == 0
