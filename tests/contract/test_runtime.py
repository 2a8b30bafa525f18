"""The OCI runtime port (``SandboxRuntime``): the fake (tests/fakes/host.py ``FakeRuntime``)
and the real ``RunscRuntime`` (host/runtime.py) agree on the argv they give, the ids they
refuse, and how long a container is listed: from its start until deleted, a stopped one
included (a restarted daemon finds and deletes what a dead sandbox left).

The real one runs only under ``--real-host``, inside the private systemd (tests/integration/
test_contracts_real.py): its argv runs in a transient unit hardened like a session's, with a
bundle of the least a container needs (the host's root read-only, ``sleep`` as nobody), and
its state under a directory of its own."""

from __future__ import annotations

import json
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ironclawd.errors import InvalidArgument
from ironclawd.host import runsc
from ironclawd.host.runtime import RunscRuntime
from ironclawd.host.systemd import SystemdUnitManager
from ironclawd.ports import SandboxRuntime, UnitSpec
from tests.fakes import FakeRuntime

WAIT = 30.0


def _bundle(directory: Path) -> Path:
    spec: dict[str, Any] = {
        "ociVersion": "1.0.2",
        "process": {"user": {"uid": 65534, "gid": 65534}, "args": ["/bin/sleep", "300"],
                    "env": ["PATH=/usr/bin:/bin"], "cwd": "/", "noNewPrivileges": True},
        "root": {"path": "/", "readonly": True},
        "hostname": "contract",
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")]},
    }  # fmt: skip
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(spec))
    return directory


class RealStarts:
    """Runs a runtime's argv as the lifecycle does: in a transient unit, writing only the
    runtime's own paths."""

    def __init__(self) -> None:
        self._units = SystemdUnitManager()
        self._names: list[str] = []

    def start(self, runtime: SandboxRuntime, argv: list[str], container_id: str) -> None:
        name = f"ironclaw-contract-{container_id}.service"
        spec = UnitSpec(name=name, argv=argv, description="ironclaw runtime contract",
                        netns_path=None, writable_paths=runtime.writable_paths(),
                        collect_mode="inactive")  # fmt: skip
        self._units.start_transient(spec, WAIT)
        self._names.append(name)

    def stop(self, container_id: str) -> None:
        self._units.stop(f"ironclaw-contract-{container_id}.service", WAIT)

    def close(self) -> None:
        for name in self._names:
            self._units.stop(name, WAIT)


class FakeStarts:
    def start(self, runtime: SandboxRuntime, argv: list[str], container_id: str) -> None:
        pass  # the fake's container exists from its argv on

    def stop(self, container_id: str) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def world(host_impl: str) -> Iterator[tuple[SandboxRuntime, RealStarts | FakeStarts, Path]]:
    # Below /run: the unit's /tmp is private, and the daemon keeps runsc's state in /run too.
    root = Path("/run") / f"ironclaw-contract-{secrets.token_hex(4)}"
    runtime: SandboxRuntime
    starts: RealStarts | FakeStarts
    if host_impl == "fake":
        root = Path("/nonexistent") / root.name
        runtime, starts = FakeRuntime(), FakeStarts()
    else:
        root.mkdir(mode=0o700)
        info = runsc.detect()
        platform = "ptrace" if "ptrace" in info.platforms else info.platforms[0]
        runtime, starts = RunscRuntime(info, root / "state", platform), RealStarts()
    try:
        yield runtime, starts, root
    finally:
        starts.close()
        if host_impl != "fake":
            for container_id in runtime.list_ids():
                runtime.delete(container_id)
            shutil.rmtree(root)


def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT} s: {what}")
        time.sleep(0.05)


def test_a_container_is_listed_from_its_start_until_deleted(
    world: tuple[SandboxRuntime, RealStarts | FakeStarts, Path],
) -> None:
    runtime, starts, root = world
    container_id = f"contract{secrets.token_hex(4)}"
    bundle = root / "bundle"
    if isinstance(starts, RealStarts):
        _bundle(bundle)
    assert container_id not in runtime.list_ids()
    argv = runtime.run_argv(bundle, container_id)
    assert Path(argv[0]).is_absolute()
    assert argv[-3:] == ["--bundle", str(bundle), container_id]
    starts.start(runtime, argv, container_id)
    until(lambda: container_id in runtime.list_ids(), f"{container_id} is listed")
    starts.stop(container_id)
    assert container_id in runtime.list_ids()  # stopped, not yet deleted
    runtime.delete(container_id)
    assert container_id not in runtime.list_ids()
    runtime.delete(container_id)  # again: nothing to do


def test_its_platform_is_named_and_its_own_paths_are_absolute(
    world: tuple[SandboxRuntime, RealStarts | FakeStarts, Path],
) -> None:
    runtime, _, _ = world
    assert runtime.platform
    assert runtime.writable_paths()
    assert all(p.is_absolute() for p in runtime.writable_paths())


@pytest.mark.parametrize("container_id", ["../escape", "has space", "x" * 129, ""])
def test_an_id_runsc_would_not_take_is_refused_before_anything_runs(
    world: tuple[SandboxRuntime, RealStarts | FakeStarts, Path], container_id: str
) -> None:
    runtime, _, root = world
    with pytest.raises(InvalidArgument, match="container id"):
        runtime.run_argv(root / "bundle", container_id)
    with pytest.raises(InvalidArgument, match="container id"):
        runtime.delete(container_id)
    assert container_id not in runtime.list_ids()
