from __future__ import annotations

import grp

import pytest

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


def test_group_names_are_the_connections_gids_looked_up_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every SendMessage asks for the caller's group names (agent permissions): the group
    database is read on the first ask of a connection only. A gid without a name has none."""
    real = grp.getgrgid
    asked: list[int] = []

    def counting(gid: int) -> grp.struct_group:
        asked.append(gid)
        return real(gid)

    monkeypatch.setattr(grp, "getgrgid", counting)
    unnamed = 4_000_000_000
    caller = Caller(uid=0, gid=0, pid=42, groups=(0, unnamed), user_name="root", authorized=True)
    root = frozenset({real(0).gr_name})
    assert caller.group_names == root
    assert caller.group_names == root
    assert sorted(asked) == [0, unnamed]  # once per distinct gid, on the first ask only
    other = Caller(uid=0, gid=0, pid=43, groups=(), user_name="root", authorized=True)
    assert other.group_names == caller.group_names
    assert sorted(asked) == [0, 0, unnamed]  # another connection looks up its own
