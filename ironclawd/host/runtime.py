"""The sandbox runtime adapter: runsc with one state root for all of ironclawd's sandboxes."""

from __future__ import annotations

from pathlib import Path

from ironclawd.errors import SandboxError
from ironclawd.host import runsc
from ironclawd.host.runsc import RunscInfo


class RunscRuntime:
    """``runsc --root=<root> ...`` for every sandbox; --network=none always (host/runsc.py)."""

    def __init__(self, info: RunscInfo, root: Path, platform: str) -> None:
        self._info = info
        self._root = root
        self._platform = platform
        root.mkdir(mode=0o700, parents=True, exist_ok=True)

    @property
    def platform(self) -> str:
        return self._platform

    def run_argv(self, bundle: Path, container_id: str) -> list[str]:
        # --host-uds=open: the agent connects to its session's sockets; the only host directory
        # with sockets mounted into the box is that session's own (docs/architecture.md §3): a
        # granted directory holding a socket is refused (host.mounts.find_socket).
        return runsc.runsc_argv(
            self._info,
            root=self._root,
            bundle=bundle,
            container_id=container_id,
            platform=self._platform,
            host_uds=True,
        )

    def writable_paths(self) -> tuple[Path, ...]:
        return (self._root,)

    def delete(self, container_id: str) -> None:
        runsc.delete_state(self._root, container_id, self._info.path)
        # A sandbox stopped while runsc was still creating it (a warm pool's, stopped soon after
        # its unit started) left "<id>_sandbox:<id>.lock" in the root, which delete keeps.
        for lock in self._root.glob(f"{container_id}_*.lock"):
            lock.unlink(missing_ok=True)

    def list_ids(self) -> list[str]:
        return [c.id for c in runsc.list_containers(self._root, self._info.path)]


class UnavailableRuntime:
    """Stands in when runsc is missing or unusable: the daemon still serves doctor and status,
    and every attempt to start a sandbox says why it cannot."""

    def __init__(self, reason: str) -> None:
        self._reason = reason

    @property
    def platform(self) -> str:
        return ""

    def run_argv(self, bundle: Path, container_id: str) -> list[str]:
        raise SandboxError(f"runsc is unavailable: {self._reason} (see: ironctl doctor)")

    def writable_paths(self) -> tuple[Path, ...]:
        return ()

    def delete(self, container_id: str) -> None:
        return None

    def list_ids(self) -> list[str]:
        return []
