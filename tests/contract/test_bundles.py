"""``ports.Bundles``: the fake (tests/fakes/host.py) and the bundle writer (bundle/writer.py,
on a tmp dir) keep, list, remove and refuse the same bundles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ironclawd import paths
from ironclawd.bundle import spec as S
from ironclawd.bundle.writer import BundleDirs
from ironclawd.domain.policy import SandboxPolicy
from ironclawd.errors import SandboxError
from ironclawd.ports import Bundles
from tests.fakes import FakeBundles

SID = "a1b2c3d4"


def _spec(sid: str, **overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "sid": sid, "agent": "demo", "uid": 1000, "gid": 1000, "host_uid": 1000,
        "host_gid": 1000, "rootfs": "/var/lib/ironclaw/rootfs/demo", "netns": S.netns_path(sid),
        "argv": ("/app/agent/agent",), "mounts": S.session_mounts(sid),
    }  # fmt: skip
    fields.update(overrides)
    return S.build_spec(SandboxPolicy(**fields))


@pytest.fixture(params=["fake", "real"])
def bundles(request: pytest.FixtureRequest) -> Bundles:
    return FakeBundles() if request.param == "fake" else BundleDirs()


def test_bundles_are_listed_by_name_until_removed(bundles: Bundles, tmp_path: Path) -> None:
    assert bundles.list_names(tmp_path / "missing") == []
    other = "e5f6a7b8"
    bundles.write(tmp_path / SID, _spec(SID), (), paths.STATE_DIR)
    bundles.write(tmp_path / other, _spec(other), (), paths.STATE_DIR)
    bundles.write(tmp_path / SID, _spec(SID, tasks_max=7), (), paths.STATE_DIR)  # replaced
    assert sorted(bundles.list_names(tmp_path)) == [SID, other]
    bundles.remove(tmp_path / SID)
    bundles.remove(tmp_path / SID)  # idempotent
    assert bundles.list_names(tmp_path) == [other]


def test_a_refused_spec_writes_no_bundle(bundles: Bundles, tmp_path: Path) -> None:
    spec = _spec(SID)
    spec["process"]["user"]["uid"] = 0  # root in the box
    with pytest.raises(
        SandboxError, match=r"refusing spec: user: process\.user\.uid: expected a non-zero id"
    ):
        bundles.write(tmp_path / SID, spec, (), paths.STATE_DIR)
    assert bundles.list_names(tmp_path) == []
