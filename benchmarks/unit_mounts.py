"""What one sandbox unit start costs per mount on the host (optional:
``make bench BENCH=unit_mounts``; not part of the default run).

systemd builds each new unit's mount namespace from a copy of PID 1's, so every mount the host
holds is paid again at every unit start. A session used to leave two there while it ran: its
netns name (an nsfs bind mount under ``/run/netns``, which the sandbox unit's
``InaccessiblePaths=-/run/netns`` then unmounts again in the copy) and its outbound tmpfs. Now it
leaves the tmpfs alone (the name is released once the unit runs).

Run inside a systemd with ironclawd installed (``make bench`` does). With the daemon's own unit
properties (``host/systemd.py`` ``build_properties``: the sandbox hardening, a netns joined by
``NetworkNamespacePath=``) and ``/bin/sleep`` as the program, each level times
``StartTransientUnit`` to the end of its start job, ``BENCH_ROUNDS`` (10) starts, the unit
stopped untimed after each:

1. ``none``: no mount of ours on the host (the baseline);
2. ``N tmpfs``: N tmpfs mounts (what N running sessions leave now), N = 250 and
   ``BENCH_MOUNTS`` (500);
3. ``N tmpfs + N netns names``: what N running sessions left before;
4. ``none, again``: everything removed, to show the machine did not drift meanwhile.

Writes ``results/bench-unit-mounts.json``.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import ROUNDS, env_int, host_mounts, ms_figure, write_result
from ironclawd.host.netns import NetnsAdapter
from ironclawd.host.systemd import SystemdUnitManager
from ironclawd.ports import UnitSpec

MOUNTS = env_int("BENCH_MOUNTS", 500)
PREFIX = "ironclaw-bmnt"
UNIT = "ironclaw-bench-mounts.service"


def start_times(units: SystemdUnitManager, netns: Path) -> list[float]:
    spec = UnitSpec(
        name=UNIT,
        argv=["/bin/sleep", "600"],
        description="IronClaw benchmark: one unit start",
        netns_path=netns,
        stop_timeout_seconds=5,
    )
    samples = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        units.start_transient(spec, 60)
        samples.append(time.perf_counter() - started)
        units.stop(UNIT, 10)
        with contextlib.suppress(Exception):
            units.reset_failed(UNIT)
    return samples


@contextlib.contextmanager
def tmpfs_mounts(count: int) -> Iterator[None]:
    base = Path(tempfile.mkdtemp(prefix="ironclaw-bench-mounts-", dir="/run"))
    made: list[Path] = []
    try:
        for i in range(count):
            target = base / str(i)
            target.mkdir()
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=1m,nosuid,nodev,noexec", "tmpfs", target],
                check=True,
            )
            made.append(target)
        yield
    finally:
        for target in made:
            subprocess.run(["umount", "-l", target], check=False)
        subprocess.run(["rm", "-rf", "--one-file-system", base], check=False)


@contextlib.contextmanager
def netns_names(count: int) -> Iterator[None]:
    adapter = NetnsAdapter()
    made: list[str] = []
    try:
        for i in range(count):
            name = f"{PREFIX}{i}"
            adapter.create(name)
            made.append(name)
        yield
    finally:
        for name in made:
            adapter.delete(name)


def main() -> None:
    units = SystemdUnitManager()
    adapter = NetnsAdapter()
    own = adapter.create(f"{PREFIX}-unit")  # the netns each timed unit joins
    levels: dict[str, dict[str, Any]] = {}
    samples: dict[str, list[float]] = {}

    def level(name: str) -> None:
        mounts = host_mounts()
        samples[name] = start_times(units, own)
        levels[name] = {
            "host_mounts": mounts,
            "starts_ms": [round(t * 1e3, 1) for t in samples[name]],
        }
        print(f"unit_mounts: {name}: {mounts} host mounts, {len(samples[name])} starts")

    try:
        level("none")
        with tmpfs_mounts(MOUNTS // 2):
            level(f"{MOUNTS // 2} tmpfs")
        with tmpfs_mounts(MOUNTS):
            level(f"{MOUNTS} tmpfs")
            with netns_names(MOUNTS):
                level(f"{MOUNTS} tmpfs + {MOUNTS} netns names")
        level("none, again")
    finally:
        with contextlib.suppress(Exception):
            units.stop(UNIT, 10)
        adapter.delete(f"{PREFIX}-unit")
    figures = [
        ms_figure(f"sandbox unit start, host with {name}", samples[name], "the same, none of ours",
                  samples["none"])
        for name in samples if name != "none"
    ]  # fmt: skip
    write_result("unit-mounts", figures, rounds=ROUNDS, levels=levels)


if __name__ == "__main__":
    main()
