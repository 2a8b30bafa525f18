"""Idle sessions: memory per session and the sandboxes' idle CPU at 10, 100 (and 500) sessions,
creation time per session against the count, and daemon restart to READY at 0 and 100 sessions.

Run inside a systemd with ironclawd installed (``make bench`` does). Steps:

1. Restart to READY with no session: ``systemctl restart ironclawd`` (Type=notify: it returns
   at READY=1) against ``systemctl restart`` of a minimal Type=notify Python service (the same
   interpreter, sending READY=1 at once) under the same systemd, interleaved.
2. The baseline sandboxes: 10 bare runsc sandboxes of the same agent (benchmarks/bare.py), idle:
   memory (PSS of every process of each sandbox, from /proc/<pid>/smaps_rollup) and CPU.
3. Sessions of agent ``demo`` created one after another over gRPC up to each count in
   ``BENCH_DENSITY`` ("10 100 500") not above ``BENCH_MAX_SESSIONS`` (100: 500 sessions take
   about 6 minutes to create on this 2-core machine, past the 15-minute budget of a full
   ``make bench``), each creation timed (the daemon runs with ``idle_timeout_seconds = 0`` so
   that no session stops itself meanwhile); at each count, after 5 s of settling: PSS per session
   (all processes of the ``ironclaw-sbx-*`` units), the drop of MemAvailable per session (what
   the host lost, daemon and tmpfs files included), and the CPU of all sandboxes together over
   ``BENCH_IDLE_SECONDS`` (10) s, as % of one core, read from /proc/<pid>/stat on the host
   (gVisor's own getrusage overcounts), and the mounts in PID 1's mount namespace (each new
   unit copies them into its own). Creation times at 11-100 and 101-500 sessions are set
   beside those at 2-10, and so is systemd's own set-up of each sandbox unit ("Starting" to
   "Started" in the journal), which is where a count-dependent cost would show.
4. Restart to READY with the sessions up (100, or the largest count), interleaved with the
   minimal service again and with ironclawd whose fd store is turned off by a drop-in
   (``FileDescriptorStoreMax=0``: the agents' control connections end and they reconnect, as
   before the hand-over). After each restart the benchmark waits until every session is
   RUNNING again (timed too) and counts the CPU the sandboxes used until then.

Writes ``results/bench-density.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc

from benchmarks import bare
from benchmarks.common import (
    ROUNDS,
    Way,
    daemon_config,
    env_int,
    figure,
    host_mounts,
    interleave,
    ms_figure,
    not_measured,
    timed,
    write_result,
)
from benchmarks.sessions import host_runsc
from benchmarks.stats import summary_ms
from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc

SOCKET = "/run/ironclaw/admin.sock"
COUNTS = [int(n) for n in os.environ.get("BENCH_DENSITY", "10 100 500").split()]
MAX_SESSIONS = env_int("BENCH_MAX_SESSIONS", 100)
IDLE_SECONDS = env_int("BENCH_IDLE_SECONDS", 10)
BARE_COUNT = 10
NEVER_IDLE_STOP = "\n[sandbox]\nidle_timeout_seconds = 0\n"
NOTIFY_UNIT = "ironclaw-bench-notify.service"
NOTIFY_SCRIPT = (
    "import os, signal, socket; s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); "
    "s.connect(os.environ['NOTIFY_SOCKET']); s.send(b'READY=1'); signal.pause()"
)
TICKS = os.sysconf("SC_CLK_TCK")
# systemd's "Starting <unit>..." and "Started <unit>." (sd-messages.h).
UNIT_STARTING = "7d4958e842da4a758f6c1cdc7b36dcc5"
UNIT_STARTED = "39f53479d3a045ac8e11786248231fbf"


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # utime, stime


def sandbox_pids(sids: Iterable[str] | None = None) -> list[int]:
    """Every process in an ``ironclaw-sbx-*`` unit (its name=systemd cgroup); with ``sids``,
    only in those sessions' units."""
    marks = ["/ironclaw-sbx-"] if sids is None else [f"/ironclaw-sbx-{s}.service" for s in sids]
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry.name}/cgroup").read_text()
        except OSError:
            continue
        if any(mark in text for mark in marks):
            pids.append(int(entry.name))
    return pids


def require_pids(pids: list[int], what: str) -> list[int]:
    """``pids``, or SystemExit if there are none: a figure of no process (0 MiB, 0% of a core)
    would pass for sandboxes idling at nothing."""
    if not pids:
        raise SystemExit(f"bench: no process found in the units of {what}")
    return pids


def descendants(roots: Iterable[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                ppid = int(
                    Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1]
                )
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def idle_cpu_percent(pids: list[int], seconds: float) -> float:
    """CPU of ``pids`` together over ``seconds``, as % of one core."""
    before = sum(cpu_ticks(p) for p in pids)
    time.sleep(seconds)
    after = sum(cpu_ticks(p) for p in pids)
    return round(100 * (after - before) / TICKS / seconds, 2)


def unit_start_seconds(units: list[str], since: float) -> list[float]:
    """systemd's "Starting" to "Started" of each of ``units`` (in that order) from the journal,
    in seconds: the unit's set-up by systemd (its mount namespace above all), without runsc or the
    daemon. A unit with either message missing is left out."""
    proc = subprocess.run(
        ["journalctl", "-o", "json", "--no-pager", f"--since=@{int(since)}",
         f"MESSAGE_ID={UNIT_STARTING}", f"MESSAGE_ID={UNIT_STARTED}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    seen: dict[tuple[str, str], int] = {}
    for line in proc.stdout.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        unit, mid = entry.get("UNIT"), entry.get("MESSAGE_ID")
        if isinstance(unit, str) and isinstance(mid, str):
            seen[(unit, mid)] = int(entry["__REALTIME_TIMESTAMP"])
    out = []
    for unit in units:
        begun, done = seen.get((unit, UNIT_STARTING)), seen.get((unit, UNIT_STARTED))
        if begun is not None and done is not None:
            out.append((done - begun) / 1e6)  # the journal's timestamps are in µs
    return out


def mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


def write_notify_unit() -> None:
    unit = Path("/run/systemd/system") / NOTIFY_UNIT
    unit.write_text(
        "[Unit]\nDescription=minimal Type=notify Python service (benchmark baseline)\n"
        # Restarted every round: systemd's start limit (5 in 10 s) would refuse it.
        "StartLimitIntervalSec=0\n\n"
        f'[Service]\nType=notify\nExecStart={sys.executable} -I -c "{NOTIFY_SCRIPT}"\n'
    )
    subprocess.run(["systemctl", "daemon-reload"], check=True)
    subprocess.run(["systemctl", "start", NOTIFY_UNIT], check=True)


def wait_running(stub: admin_pb2_grpc.AdminServiceStub, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            listed = stub.ListSessions(admin_pb2.ListSessionsRequest(), timeout=10).sessions
        except grpc.RpcError:
            time.sleep(0.1)
            continue
        if sum(s.state == admin_pb2.SESSION_STATE_RUNNING for s in listed) >= count:
            return
        time.sleep(0.1)
    raise SystemExit(f"bench: {count} sessions not running again within {timeout:g} s")


NO_STORE_DROPIN = Path("/run/systemd/system/ironclawd.service.d/bench-no-fd-store.conf")


def _fd_store(enabled: bool) -> None:
    """Turn the daemon's fd store off (``FileDescriptorStoreMax=0``: systemd refuses what a
    stopping daemon hands it, and the agents reconnect as before issue 17's hand-over) or on."""
    if enabled:
        NO_STORE_DROPIN.unlink(missing_ok=True)
    else:
        NO_STORE_DROPIN.parent.mkdir(parents=True, exist_ok=True)
        NO_STORE_DROPIN.write_text("[Service]\nFileDescriptorStoreMax=0\n")
    subprocess.run(["systemctl", "daemon-reload"], check=True)


def restarts(
    stub: admin_pb2_grpc.AdminServiceStub, sessions: int, compare_store: bool = False
) -> dict[str, list[float]]:
    """Restart to READY of ironclawd and of the minimal service, interleaved; with
    ``compare_store``, also ironclawd with its fd store off, and for both the time until every
    session is running again and the CPU the sandboxes used meanwhile ("<way>_back",
    "<way>_cpu", in seconds)."""

    def restart(name: str) -> dict[str, float]:
        # Untimed: forget earlier restarts, so systemd's start limit never refuses one.
        subprocess.run(["systemctl", "reset-failed", "ironclawd"], check=False)
        pids = sandbox_pids()
        cpu_before = sum(cpu_ticks(p) for p in pids)
        started = time.perf_counter()
        subprocess.run(["systemctl", "restart", "ironclawd"], check=True)
        ready = time.perf_counter() - started
        wait_running(stub, sessions)
        back = time.perf_counter() - started
        cpu = (sum(cpu_ticks(p) for p in pids) - cpu_before) / TICKS
        return {name: ready, f"{name}_back": back, f"{name}_cpu": cpu}

    def no_store(_r: int) -> dict[str, float]:
        _fd_store(False)
        try:
            return restart("no_store")
        finally:
            _fd_store(True)

    def minimal(_r: int) -> float:
        return timed(lambda: subprocess.run(["systemctl", "restart", NOTIFY_UNIT], check=True))

    ways: dict[str, Way] = {"ironclawd": lambda _r: restart("ironclawd"), "minimal": minimal}
    if compare_store:
        ways["no_store"] = no_store
    return interleave(ways, ROUNDS)


def restart_figures(top: int, loaded: dict[str, list[float]]) -> list[dict[str, Any]]:
    off = "the same with the fd store off (agents reconnect)"
    return [
        ms_figure(f"restart to READY, {top} sessions", loaded["ironclawd"],
                  "a minimal Type=notify Python service", loaded["minimal"]),
        ms_figure(f"restart to READY, {top} sessions (fd store)", loaded["ironclawd"],
                  off, loaded["no_store"]),
        ms_figure(f"restart until all {top} sessions run again", loaded["ironclawd_back"],
                  off, loaded["no_store_back"]),
        ms_figure(f"sandboxes' CPU during that restart, {top} sessions (ms of CPU)",
                  loaded["ironclawd_cpu"], off, loaded["no_store_cpu"]),
    ]  # fmt: skip


def bare_idle() -> dict[str, Any]:
    info, platform = host_runsc()
    boxes = []
    try:
        for _ in range(BARE_COUNT):
            box = bare.BareSandbox(info, platform, bare.agent_rootfs())
            box.start()
            boxes.append(box)
        time.sleep(5)
        pids = descendants(b.proc.pid for b in boxes if b.proc is not None)
        pss = [sum(_pss_kib(p) for p in descendants([b.proc.pid])) for b in boxes if b.proc]
        cpu = idle_cpu_percent(pids, IDLE_SECONDS)
    finally:
        for box in boxes:
            box.stop()
    return {"pss_mib_per_sandbox": round(sum(pss) / len(pss) / 1024, 1), "cpu_percent": cpu}


def main() -> None:
    if not Path(SOCKET).exists():
        raise SystemExit("bench: run inside a systemd with ironclawd installed (make bench)")
    write_notify_unit()
    counts = sorted({min(c, MAX_SESSIONS) for c in COUNTS})
    skipped = [c for c in COUNTS if c > MAX_SESSIONS]
    figures: list[dict[str, Any]] = []
    levels: dict[int, Any] = {}
    sids: list[str] = []
    create_times: list[float] = []
    unit_s: list[float] = []
    # Sessions that stop themselves when idle (the default: after 15 min) would be gone before
    # 500 are made: the figures are of idle sessions that stay up.
    with daemon_config(NEVER_IDLE_STOP), grpc.insecure_channel(f"unix:{SOCKET}") as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        idle = restarts(stub, 0)
        figures.append(
            ms_figure(
                "restart to READY, 0 sessions",
                idle["ironclawd"],
                "a minimal Type=notify Python service",
                idle["minimal"],
            )
        )
        first = stub.CreateSession(admin_pb2.CreateSessionRequest(agent="demo"), timeout=120)
        sids.append(first.session.sid)  # (its bundle names the agent image for the baseline)
        base = bare_idle()
        free_before = mem_available_kib()
        mounts_before = host_mounts()
        since = time.time() - 1
        try:
            for count in counts:
                while len(sids) < count:
                    started = time.perf_counter()
                    reply = stub.CreateSession(
                        admin_pb2.CreateSessionRequest(agent="demo"), timeout=120
                    )
                    create_times.append(time.perf_counter() - started)
                    sids.append(reply.session.sid)
                time.sleep(5)
                pids = require_pids(sandbox_pids(), f"{count} sessions")
                pss_mib = sum(_pss_kib(p) for p in pids) / 1024 / count
                cpu = idle_cpu_percent(pids, IDLE_SECONDS)
                lost = (free_before - mem_available_kib()) / 1024 / (count - 1 or 1)
                mounts = host_mounts()
                levels[count] = {
                    "pss_mib_per_session": round(pss_mib, 1),
                    "mem_available_drop_mib_per_session": round(lost, 1),
                    "idle_cpu_percent_all_sandboxes": cpu,
                    "processes": len(pids),
                    "host_mounts": mounts,
                    "host_mounts_per_session": round(
                        (mounts - mounts_before) / (count - 1 or 1), 2
                    ),
                }
                print(f"density: {count} sessions: {levels[count]}")
                figures.append(
                    figure(
                        f"idle memory per session (PSS), {count} sessions",
                        {"median": round(pss_mib, 1)},
                        f"a bare sandbox (PSS, {BARE_COUNT} idle)",
                        {"median": base["pss_mib_per_sandbox"]},
                        unit="MiB",
                    )
                )
                figures.append(
                    figure(
                        f"idle CPU of {count} sandboxes together",
                        {"median": cpu},
                        f"bare sandboxes idle ({BARE_COUNT} measured, scaled to {count})",
                        {"median": round(base["cpu_percent"] / BARE_COUNT * count, 2)},
                        unit="% of a core",
                    )
                )
            # create_times[i] is session i + 2's (the first was made before the baseline).
            first_batch = create_times[:9]
            for lo, hi in ((11, 100), (101, 500)):
                chunk = create_times[lo - 2 : hi - 1]
                if chunk and first_batch:
                    figures.append(
                        ms_figure(
                            f"create, sessions {lo}-{lo + len(chunk) - 1} (flat in the count?)",
                            chunk,
                            "create, sessions 2-10 (same run)",
                            first_batch,
                        )
                    )
            # The same spans for systemd's set-up of each sandbox unit alone.
            unit_s = unit_start_seconds([f"ironclaw-sbx-{sid}.service" for sid in sids[1:]], since)
            if len(unit_s) == len(sids) - 1:
                for lo, hi in ((11, 100), (101, 500)):
                    chunk = unit_s[lo - 2 : hi - 1]
                    if chunk:
                        figures.append(
                            ms_figure(
                                f"sandbox unit set-up by systemd (Starting to Started), sessions "
                                f"{lo}-{lo + len(chunk) - 1}",
                                chunk,
                                "the same, sessions 2-10 (same run)",
                                unit_s[:9],
                            )
                        )
            else:
                print(f"bench: unit start times for {len(unit_s)} of {len(sids) - 1} units")
            top = len(sids)
            figures += restart_figures(top, restarts(stub, top, compare_store=True))
        finally:
            for sid in sids:
                try:
                    stub.RemoveSession(
                        admin_pb2.RemoveSessionRequest(sid=sid, force=True), timeout=120
                    )
                except grpc.RpcError as err:
                    print(f"bench: removing {sid}: {err.details()}", file=sys.stderr)
            subprocess.run(["systemctl", "stop", NOTIFY_UNIT], check=False)
    for count in skipped:
        figures.append(
            not_measured(
                f"idle memory per session, {count} sessions",
                f"above BENCH_MAX_SESSIONS={MAX_SESSIONS}",
                unit="MiB",
            )
        )
    write_result(
        "density" if MAX_SESSIONS == 100 else f"density-{MAX_SESSIONS}",
        figures,
        rounds=ROUNDS,
        levels=levels,
        bare=base,
        create_ms_all=[round(t * 1e3, 1) for t in create_times],
        unit_start_ms_all=[round(t * 1e3, 1) for t in unit_s],
        create_summary=summary_ms(create_times) if create_times else None,
        notes="PSS counts each shared page once across processes. The drop of MemAvailable per "
        "session (levels in bench-density.json) is noise while other work shares the machine. "
        "Larger counts: BENCH_MAX_SESSIONS=500 make bench BENCH=density.",
    )


if __name__ == "__main__":
    main()
