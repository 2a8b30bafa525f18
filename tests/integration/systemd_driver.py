"""Runs *inside* the private systemd and drives the real adapters; prints one JSON object.

The private systemd has its own mount namespace (its own /run, /run/netns, D-Bus socket), so the
adapters must run in there: tests call ``.venv/bin/python tests/integration/systemd_driver.py``
through ``private_systemd.run``. Subcommands (argv after the subcommand):

    netns-create NAME | netns-delete NAME | netns-inode NAME
    start UNIT NETNS_PATH COLLECT_MODE MEMORY_MAX TIMEOUT -- ARGV...
    stop UNIT TIMEOUT | kill UNIT SIGNAL | state UNIT | list PATTERN | reset UNIT
    wait UNIT TIMEOUT
    bench N NETNS_PATH       start/stop N units, report each start's seconds
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ironclawd.errors import IronclawError
from ironclawd.host.netns import NetnsAdapter
from ironclawd.host.systemd import SystemdUnitManager
from ironclawd.ports import UnitSpec, UnitState


def _state(s: UnitState | None) -> dict[str, Any] | None:
    return None if s is None else asdict(s)


def _spec(unit: str, netns: str, collect: str, memory: int, argv: list[str]) -> UnitSpec:
    return UnitSpec(
        name=unit,
        argv=argv,
        description=f"ironclaw test {unit}",
        netns_path=Path(netns),
        slice="ironclaw-test.slice",
        memory_max_bytes=memory,
        tasks_max=32,
        cpu_quota_percent=50,
        collect_mode=collect,
        stop_timeout_seconds=5,
    )


def main(argv: list[str]) -> dict[str, Any]:
    cmd, args = argv[0], argv[1:]
    units, netns = SystemdUnitManager(), NetnsAdapter()
    if cmd == "netns-create":
        return {"path": str(netns.create(args[0]))}
    if cmd == "netns-delete":
        netns.delete(args[0])
        netns.delete(args[0])
        return {"exists": os.path.lexists(f"/run/netns/{args[0]}")}
    if cmd == "netns-inode":
        return {"inode": os.stat(f"/run/netns/{args[0]}").st_ino}
    if cmd == "start":
        unit, ns, collect, memory, timeout = args[:5]
        spec = _spec(unit, ns, collect, int(memory), args[args.index("--") + 1 :])
        t0 = time.monotonic()
        state = units.start_transient(spec, float(timeout))
        return {"state": _state(state), "seconds": time.monotonic() - t0}
    if cmd == "stop":
        t0 = time.monotonic()
        units.stop(args[0], float(args[1]))
        return {"state": _state(units.state(args[0])), "seconds": time.monotonic() - t0}
    if cmd == "state":
        return {"state": _state(units.state(args[0]))}
    if cmd == "list":
        return {"units": [asdict(s) for s in units.list_units(args[0])]}
    if cmd == "reset":
        units.reset_failed(args[0])
        return {"state": _state(units.state(args[0]))}
    if cmd == "wait":
        t0 = time.monotonic()
        waited = units.wait_inactive(args[0], float(args[1]))
        return {"state": _state(waited), "seconds": time.monotonic() - t0}
    if cmd == "bench":
        times = []
        for i in range(int(args[0])):
            spec = _spec(f"ironclaw-bench-{i}.service", args[1], "inactive-or-failed", 1 << 26,
                         ["/bin/sleep", "300"])  # fmt: skip
            t0 = time.monotonic()
            units.start_transient(spec, 10)
            times.append(time.monotonic() - t0)
            units.stop(spec.name, 10)
        return {"seconds": times}
    raise SystemExit(f"unknown subcommand {cmd}")


if __name__ == "__main__":
    try:
        out = main(sys.argv[1:])
    except IronclawError as exc:
        out = {"error": type(exc).__name__, "message": str(exc)}
    print(json.dumps(out))
