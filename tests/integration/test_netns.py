"""host/netns.py against real network namespaces on this host (names ironclaw-test-<random>)."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ironclawd.errors import HostError, InvalidArgument
from ironclawd.host.netns import NetnsAdapter

pytestmark = pytest.mark.integration

NETNS = Path("/run/netns")


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def new_name() -> Iterator[Callable[[], str]]:
    """Fresh names; whatever sits at them afterwards is unmounted and removed."""
    names: list[str] = []

    def make() -> str:
        names.append(f"ironclaw-test-{secrets.token_hex(4)}")
        return names[-1]

    yield make
    for name in names:
        path = NETNS / name
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        if os.path.lexists(path):
            path.unlink()


@pytest.fixture
def adapter() -> NetnsAdapter:
    return NetnsAdapter()


def test_create_makes_a_namespace_with_only_a_down_loopback(
    adapter: NetnsAdapter, new_name: Callable[[], str]
) -> None:
    name = new_name()
    path = adapter.create(name)
    assert path == NETNS / name
    # Checked with iproute2, independently of pyroute2.
    links = ip("-n", name, "-o", "link", "show").splitlines()
    assert len(links) == 1
    assert ": lo: " in links[0]
    assert "state DOWN" in links[0]
    assert ip("-n", name, "route", "show", "table", "all").strip() == ""
    assert ip("-n", name, "-6", "route", "show", "table", "all").strip() == ""
    assert ip("-n", name, "addr", "show").count("inet") == 0
    assert os.stat(path).st_ino != os.stat("/proc/self/ns/net").st_ino
    assert name in adapter.list_names("ironclaw-test-")


def test_create_refuses_an_existing_name_and_leaves_it_alone(
    adapter: NetnsAdapter, new_name: Callable[[], str]
) -> None:
    name = new_name()
    path = adapter.create(name)
    inode = os.stat(path).st_ino
    with pytest.raises(HostError, match=f"creating netns {name}: .* already exists"):
        adapter.create(name)
    assert os.stat(path).st_ino == inode
    adapter.verify(name)


def test_verify_refuses_a_regular_file(adapter: NetnsAdapter, new_name: Callable[[], str]) -> None:
    name = new_name()
    (NETNS / name).write_bytes(b"")
    with pytest.raises(HostError, match="not a namespace file"):
        adapter.verify(name)


def test_verify_refuses_a_bind_mounted_non_namespace(
    adapter: NetnsAdapter, new_name: Callable[[], str]
) -> None:
    name = new_name()
    (NETNS / name).write_bytes(b"")
    subprocess.run(["mount", "--bind", "/etc/hostname", str(NETNS / name)], check=True)
    with pytest.raises(HostError, match="not a namespace file"):
        adapter.verify(name)
    adapter.delete(name)
    assert not os.path.lexists(NETNS / name)
    assert Path("/etc/hostname").exists()


def test_verify_refuses_another_namespace_type(
    adapter: NetnsAdapter, new_name: Callable[[], str]
) -> None:
    name = new_name()
    (NETNS / name).write_bytes(b"")
    subprocess.run(["mount", "--bind", "/proc/self/ns/uts", str(NETNS / name)], check=True)
    with pytest.raises(HostError, match="not a network namespace"):
        adapter.verify(name)


def test_verify_refuses_the_hosts_own_namespace(
    adapter: NetnsAdapter, new_name: Callable[[], str]
) -> None:
    name = new_name()
    (NETNS / name).write_bytes(b"")
    subprocess.run(["mount", "--bind", "/proc/self/ns/net", str(NETNS / name)], check=True)
    with pytest.raises(HostError, match="daemon's own network namespace"):
        adapter.verify(name)


def test_verify_refuses_a_symlink_even_to_a_good_namespace(
    adapter: NetnsAdapter, new_name: Callable[[], str]
) -> None:
    good, link = new_name(), new_name()
    adapter.create(good)
    (NETNS / link).symlink_to(NETNS / good)
    with pytest.raises(HostError, match="is a symlink"):
        adapter.verify(link)
    adapter.delete(link)  # removes the link, never what it points to
    assert not os.path.lexists(NETNS / link)
    adapter.verify(good)


def test_verify_refuses_extra_links_addresses_and_routes(
    adapter: NetnsAdapter, new_name: Callable[[], str]
) -> None:
    extra, up = new_name(), new_name()
    adapter.create(extra)
    # A bridge: built into this kernel (the dummy module is not available here).
    ip("-n", extra, "link", "add", "br0", "type", "bridge")
    with pytest.raises(HostError, match=r"expected only lo, found links \['br0', 'lo'\]"):
        adapter.verify(extra)
    adapter.create(up)
    ip("-n", up, "link", "set", "lo", "up")
    with pytest.raises(HostError, match="expected no address"):
        adapter.verify(up)
    ip("-n", up, "addr", "flush", "dev", "lo")
    ip("-n", up, "route", "add", "blackhole", "10.0.0.0/8")
    with pytest.raises(HostError, match=r"expected no route, found.*10\.0\.0\.0/8"):
        adapter.verify(up)


def test_delete_is_idempotent(adapter: NetnsAdapter, new_name: Callable[[], str]) -> None:
    name = new_name()
    adapter.create(name)
    adapter.delete(name)
    adapter.delete(name)
    assert not os.path.lexists(NETNS / name)
    assert name not in adapter.list_names("ironclaw-")
    with pytest.raises(HostError, match="No such file"):
        adapter.verify(name)


@pytest.mark.parametrize(
    "bad",
    ["", "x", "ironclaw-", "ironclaw-../x", "ironclaw-a/b", "ironclaw-A", "ironclaw-" + "a" * 56],
)
def test_names_are_validated(adapter: NetnsAdapter, bad: str) -> None:
    for op in (adapter.create, adapter.verify, adapter.delete):
        with pytest.raises(InvalidArgument, match="netns name"):
            op(bad)
