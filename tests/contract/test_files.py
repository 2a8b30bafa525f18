"""Ports whose real adapters need only files: Clock, Credentials, MountSources. Each contract
runs against the fake and the real adapter (on a tmp dir)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ironclawd.errors import NotFound, PolicyDenied
from ironclawd.host.clock import SystemClock
from ironclawd.host.mounts import HostMounts
from ironclawd.ports import Clock, Credentials, MountSources
from ironclawd.store.credentials import CredentialStore
from tests.fakes import FakeClock, FakeCredentials, FakeMounts


@pytest.mark.parametrize("make", [FakeClock, SystemClock], ids=["fake", "real"])
def test_clock_readings_never_go_back(make: Callable[[], Clock]) -> None:
    clock = make()
    wall, mono = clock.time(), clock.monotonic()
    if isinstance(clock, FakeClock):
        clock.advance(1.5)
    assert clock.time() >= wall
    assert clock.monotonic() >= mono
    assert wall > 1_000_000 - 1  # seconds since the epoch, not since boot


SECRET = "sk-contract-0123456789"


@pytest.fixture(params=["fake", "real"])
def credentials(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Credentials:
    if request.param == "fake":
        return FakeCredentials(upstream=SECRET)
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "upstream").write_text(SECRET + "\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))  # systemd's: no owner check
    return CredentialStore(tmp_path / "etc-credentials")


def test_credentials_by_name(credentials: Credentials) -> None:
    assert credentials.get("upstream") == SECRET
    with pytest.raises(NotFound, match="credential 'missing' not found") as caught:
        credentials.get("missing")
    assert SECRET not in str(caught.value)


@pytest.fixture(params=["fake", "real"])
def mounts(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[MountSources, Path]:
    """A MountSources over ``tmp_path/allowed`` holding a directory ``data`` and a file."""
    allowed = tmp_path / "allowed"
    (allowed / "data").mkdir(parents=True)
    (allowed / "file").write_text("x")
    if request.param == "fake":
        return FakeMounts([str(allowed / "data")], files=[str(allowed / "file")]), allowed
    return HostMounts(), allowed


def test_mount_sources_resolve_only_existing_dirs_below_the_allowlist(
    mounts: tuple[MountSources, Path], tmp_path: Path
) -> None:
    sources, allowed = mounts
    data = str(allowed / "data")
    assert sources.resolve(data, [str(allowed)]) == data
    for source, why in [
        (str(allowed / "missing"), "No such file or directory"),
        (str(tmp_path), "not below"),
        (str(allowed / "file"), "not a directory"),
    ]:
        with pytest.raises(PolicyDenied, match=f"mount source {source}: {why}"):
            sources.resolve(source, [str(allowed)])
    with pytest.raises(PolicyDenied, match="mount_allowlist is empty"):
        sources.resolve(data, [])


def test_a_mount_frame_is_made_afresh_and_removed(
    mounts: tuple[MountSources, Path], tmp_path: Path
) -> None:
    sources, _ = mounts
    frame = tmp_path / "frames" / "sid"
    sources.make_frame(frame, ["a", "b"])
    sources.make_frame(frame, ["a"])  # again: replaced, not merged
    sources.remove_frame(frame)
    sources.remove_frame(frame)  # idempotent
    assert not os.path.lexists(frame)
