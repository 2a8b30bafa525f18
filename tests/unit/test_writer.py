"""bundle/writer.py: the atomic bundle writer (tmp_path only)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from ironclawd.bundle import spec as S
from ironclawd.bundle import writer
from ironclawd.domain.policy import SandboxPolicy
from ironclawd.errors import HostError, SandboxError

SID = "a1b2c3d4"


def good_spec(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "sid": SID, "agent": "demo", "uid": 1000, "gid": 1000, "host_uid": 1000, "host_gid": 1000,
        "rootfs": "/var/lib/ironclaw/rootfs/demo", "netns": S.netns_path(SID),
        "argv": ("/app/agent/agent",), "mounts": S.session_mounts(SID),
    }  # fmt: skip
    fields.update(overrides)
    return S.build_spec(SandboxPolicy(**fields))


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_writes_config_and_private_dir(tmp_path: Path) -> None:
    bundle = tmp_path / SID
    spec = good_spec()
    written = writer.write_bundle(bundle, spec)
    assert written == bundle / "config.json"
    assert json.loads(written.read_text()) == spec
    assert written.read_text() == S.render_spec(spec)
    assert mode(bundle) == 0o700
    assert mode(written) == 0o600
    assert sorted(p.name for p in bundle.iterdir()) == ["config.json"]


def test_tightens_an_existing_dir(tmp_path: Path) -> None:
    bundle = tmp_path / SID
    bundle.mkdir(mode=0o755)
    writer.write_bundle(bundle, good_spec())
    assert mode(bundle) == 0o700


def test_replaces_existing_config_without_leftovers(tmp_path: Path) -> None:
    bundle = tmp_path / SID
    writer.write_bundle(bundle, good_spec())
    second = good_spec(tasks_max=7)
    writer.write_bundle(bundle, second)
    assert json.loads((bundle / "config.json").read_text())["linux"]["resources"]["pids"] == {
        "limit": 7
    }
    assert sorted(p.name for p in bundle.iterdir()) == ["config.json"]


def test_refused_spec_writes_nothing(tmp_path: Path) -> None:
    bundle = tmp_path / SID
    spec = good_spec()
    spec["root"]["readonly"] = False
    with pytest.raises(SandboxError, match="root-readonly"):
        writer.write_bundle(bundle, spec)
    assert not bundle.exists()


def test_symlink_in_place_of_bundle_dir_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    bundle = tmp_path / SID
    bundle.symlink_to(elsewhere)
    with pytest.raises(HostError, match=f"writing bundle {bundle}"):
        writer.write_bundle(bundle, good_spec())
    assert list(elsewhere.iterdir()) == []
    assert mode(elsewhere) == 0o755


def test_missing_parent_is_a_host_error(tmp_path: Path) -> None:
    with pytest.raises(HostError, match="writing bundle"):
        writer.write_bundle(tmp_path / "absent" / SID, good_spec())


def test_failed_write_keeps_old_config_and_removes_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / SID
    writer.write_bundle(bundle, good_spec())
    before = (bundle / "config.json").read_bytes()

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(HostError, match=r"config\.json: No space left on device"):
        writer.write_bundle(bundle, good_spec(tasks_max=9))
    assert (bundle / "config.json").read_bytes() == before
    assert sorted(p.name for p in bundle.iterdir()) == ["config.json"]
