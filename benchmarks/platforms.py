"""runsc platforms: the same bare sandbox (benchmarks/bare.py: same spec, image and agent) on
Debian 12's runsc (20221219, ptrace only) and on Debian 13's (20240729) with ptrace and with
systrap, interleaved round by round: start to the agent's hello, a message round trip (the
agent's queues and a stub model) and teardown.

The whole of IronClaw on Debian 13's runsc too, systrap against ptrace, in the same rounds:
each round restarts the daemon with ``[sandbox] runsc`` and ``platform`` set, then times
CreateSession over gRPC, the warm round trip (SendMessage until the reply reaches an open
WatchReplies stream, the messages benchmark's way) and RemoveSession. The platform is the
daemon's, so these ways cannot share one daemon; the restart is not timed.

Debian 13's runsc is a static Go binary that runs on this host. It is taken, in this order,
from ``build/runsc-trixie/runsc`` (the cache), a ``.deb`` named by ``BENCH_RUNSC_DEB``, the e2e
tier's apt cache (``build/e2e/apt-archives/trixie``) or the cached trixie chroot's, or
downloaded from deb.debian.org (its path and SHA-256 read from trixie's ``Packages`` index,
the hash checked); if none works the figures say "not measured" and why,
and the run goes on. The daemon itself takes another runsc with ``[sandbox] runsc = PATH`` and
a platform with ``[sandbox] platform`` (``auto``: systrap when a trial sandbox runs on it).
``BENCH_ROUNDS`` (10) rounds, ``BENCH_PLATFORM_TRIPS`` (10) round trips per sandbox.
Writes ``results/bench-platforms.json``.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import queue
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from benchmarks import bare
from benchmarks.common import (
    DAEMON_CONFIG,
    ROOT,
    ROUNDS,
    Way,
    daemon_config,
    env_int,
    interleave,
    ms_figure,
    not_measured,
    write_result,
)
from benchmarks.messages import AGENT_CONFIG, Done, IronclawSessions, round_trip
from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from ironclawd.errors import IronclawError
from ironclawd.host import runsc

TRIPS = env_int("BENCH_PLATFORM_TRIPS", 10)
CACHE = ROOT / "build" / "runsc-trixie"
MIRROR = "https://deb.debian.org/debian/"
INDEX = MIRROR + "dists/trixie/main/binary-amd64/Packages.xz"


def _debs() -> list[Path]:
    named = os.environ.get("BENCH_RUNSC_DEB")
    found = [Path(named)] if named else []
    found += sorted((ROOT / "build/e2e/apt-archives/trixie").glob("runsc_*.deb"))
    found += sorted((ROOT / "build/deb-chroot/trixie").glob("*/var/cache/apt/archives/runsc_*"))
    return [p for p in found if p.is_file()]


def _index_entry() -> dict[str, str]:
    """runsc's stanza of trixie's Packages index (the pool path moves with the source
    package's name: a fixed URL went stale)."""
    with urllib.request.urlopen(INDEX, timeout=60) as reply:
        text = lzma.decompress(reply.read()).decode()
    for stanza in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        if fields.get("Package") == "runsc":
            return fields
    raise OSError(f"no runsc in {INDEX}")


def _download(dest: Path) -> str | None:
    """Fetch the .deb trixie's index names into ``dest``, its SHA-256 checked; None, or why
    it failed."""
    url = INDEX
    try:
        entry = _index_entry()
        url = MIRROR + urllib.parse.quote(entry["Filename"])
        with urllib.request.urlopen(url, timeout=120) as reply:
            body = reply.read()
        if hashlib.sha256(body).hexdigest() != entry["SHA256"]:
            return f"downloading {url}: SHA-256 differs from trixie's index"
        dest.write_bytes(body)
    except (OSError, KeyError) as exc:
        dest.unlink(missing_ok=True)
        return f"downloading {url}: {exc}"
    return None


def trixie_runsc() -> tuple[Path | None, str]:
    """(path of Debian 13's runsc, where it came from) or (None, why there is none)."""
    binary = CACHE / "runsc"
    if binary.is_file():
        return binary, f"cached in {binary}"
    CACHE.mkdir(parents=True, exist_ok=True)
    debs = _debs()
    why = ""
    if not debs:
        deb = CACHE / "runsc-trixie.deb"
        failed = _download(deb)
        if failed:
            return None, f"no Debian 13 runsc .deb here (build/e2e, BENCH_RUNSC_DEB); {failed}"
        debs, why = [deb], "downloaded from deb.debian.org"
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        proc = subprocess.run(
            ["dpkg-deb", "-x", str(debs[0]), tmp], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            return None, f"unpacking {debs[0]}: {proc.stderr.strip()}"
        shutil.move(Path(tmp) / "usr/bin/runsc", binary)
    return binary, why or f"from {debs[0]}"


def _parts(
    name: str,
    create: Callable[[], None],
    trip: Callable[[int], float],
    stop: Callable[[], None],
) -> dict[str, float]:
    """``create`` timed, TRIPS + 1 round trips (the median of the warm ones), ``stop`` timed
    whatever happened, keyed ``<name>:<part>``."""
    started = time.perf_counter()
    create()
    took = {"create": time.perf_counter() - started}
    try:
        trips = [trip(i) for i in range(TRIPS + 1)]
        took["trip"] = statistics.median(trips[1:])  # of an even count: the two middle ones
    finally:
        t0 = time.perf_counter()
        stop()
        took["stop"] = time.perf_counter() - t0
    return {f"{name}:{part}": value for part, value in took.items()}


def _way(name: str, info: runsc.RunscInfo, platform: str, rootfs: Path) -> Way:
    """One bare sandbox per round: start, round trips, teardown."""

    def run(_r: int) -> dict[str, float]:
        box = bare.BareSandbox(info, platform, rootfs)

        def trip(i: int) -> float:
            if i == 0:
                box.open_messages()  # untimed: the first trip is not counted
            t0 = time.perf_counter()
            seq = box.send(f"trip {i}")
            while box.replies.get(timeout=60)[1] != seq:
                pass
            return time.perf_counter() - t0

        return _parts(name, box.start, trip, box.stop)

    return run


def _ironclaw_way(name: str, path: Path, platform: str, base_config: str) -> Way:
    """The daemon on ``path`` with ``platform``: a session per round, created, round trips,
    removed."""
    config = (
        base_config + AGENT_CONFIG + (f'\n[sandbox]\nrunsc = "{path}"\nplatform = "{platform}"\n')
    )

    def run(_r: int) -> dict[str, float]:
        DAEMON_CONFIG.write_text(config)
        # Untimed: forget earlier restarts, so systemd's start limit (5 in 10 s) never refuses one.
        subprocess.run(["systemctl", "reset-failed", "ironclawd.service"], check=False)
        subprocess.run(["systemctl", "restart", "ironclawd.service"], check=True)
        with grpc.insecure_channel("unix:/run/ironclaw/admin.sock") as channel:
            done: Done = queue.Queue()
            sessions = IronclawSessions(admin_pb2_grpc.AdminServiceStub(channel), done)
            return _parts(
                name,
                lambda: sessions.grow(1),
                lambda _i: round_trip(sessions.send, done),
                sessions.close,
            )

    return run


def main() -> None:
    previous = DAEMON_CONFIG.read_text() if DAEMON_CONFIG.exists() else ""
    # daemon_config puts the daemon's own config back and restarts it, however this ends.
    with daemon_config(""):
        figures, problems, source = _measure(previous)
    # After the restart: the machine's line names the daemon's own platform, not the last way's.
    write_result(
        "platforms",
        figures,
        rounds=ROUNDS,
        trips=TRIPS,
        trixie_runsc=source,
        problems=problems,
        notes="; ".join(problems),
    )


def _measure(base_config: str) -> tuple[list[Any], list[str], str]:
    """(figures, problems, where Debian 13's runsc came from)."""
    host = runsc.detect(Path("/usr/bin/runsc"))
    rootfs = bare.agent_rootfs() if any(bare.BUNDLES.glob("*/config.json")) else None
    if rootfs is None:
        with grpc.insecure_channel("unix:/run/ironclaw/admin.sock") as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)
            sid = stub.CreateSession(admin_pb2.CreateSessionRequest(agent="demo"), timeout=120)
            rootfs = bare.agent_rootfs()
            stub.RemoveSession(admin_pb2.RemoveSessionRequest(sid=sid.session.sid, force=True))
    ways: dict[str, Way] = {}
    name = f"runsc {host.version} ptrace"
    ways[name] = _way(name, host, "ptrace", rootfs)
    path, source = trixie_runsc()
    problems = []
    if path is not None:
        try:
            new = runsc.detect(path)
        except IronclawError as exc:
            problems.append(f"runsc at {path}: {exc}")
        else:
            for platform in ("ptrace", "systrap"):
                name = f"runsc {new.version} {platform}"
                if platform in new.platforms:
                    ways[name] = _way(name, new, platform, rootfs)
                    ours = f"ironclaw on runsc {new.version} {platform}"
                    ways[ours] = _ironclaw_way(ours, path, platform, base_config)
                else:
                    problems.append(f"runsc {new.version} offers no {platform}")
    else:
        problems.append(source)
    # A platform that cannot start a sandbox here is reported, not fatal.
    for name in list(ways):
        try:
            ways[name](0)
        except (
            SystemExit,
            IronclawError,
            OSError,
            grpc.RpcError,
            subprocess.CalledProcessError,
        ) as exc:
            problems.append(f"{name}: {exc}")
            del ways[name]
    by_way: dict[str, dict[str, list[float]]] = {}
    for key, values in interleave(ways, ROUNDS, warmup=0).items():
        way, _, part = key.rpartition(":")
        by_way.setdefault(way, {})[part] = values
    return _figures(by_way, problems), problems, source


def _figures(by_way: dict[str, dict[str, list[float]]], problems: list[str]) -> list[Any]:
    parts = (
        ("create", "bare start to hello"),
        ("trip", "bare message round trip"),
        ("stop", "bare teardown"),
    )
    bare_ways = [w for w in by_way if not w.startswith("ironclaw ")]
    systrap = next((w for w in bare_ways if w.endswith(" systrap")), None)
    ptrace_new = next((w for w in bare_ways if w.endswith(" ptrace") and "20240729" in w), None)
    ptrace_old = next((w for w in bare_ways if w.endswith(" ptrace") and w != ptrace_new), None)
    out = []
    for part, label in parts:
        if systrap and ptrace_new:
            out.append(
                ms_figure(
                    f"{label}, {systrap}",
                    by_way[systrap][part],
                    f"the same on {ptrace_new}",
                    by_way[ptrace_new][part],
                )
            )
        else:
            out.append(not_measured(f"{label}, systrap", "; ".join(problems) or "no systrap"))
        if ptrace_new and ptrace_old:
            out.append(
                ms_figure(
                    f"{label}, {ptrace_new}",
                    by_way[ptrace_new][part],
                    f"the same on {ptrace_old}",
                    by_way[ptrace_old][part],
                )
            )
    return out + _ironclaw_figures(by_way, systrap, ptrace_new, problems)


def _ironclaw_figures(
    by_way: dict[str, dict[str, list[float]]],
    bare_systrap: str | None,
    bare_ptrace: str | None,
    problems: list[str],
) -> list[Any]:
    """IronClaw on systrap against IronClaw on ptrace (the same runsc), and each platform's
    round trip against the bare sandbox on it."""
    parts = (
        ("create", "IronClaw session create (gRPC)"),
        ("trip", "IronClaw message round trip"),
        ("stop", "IronClaw session remove (gRPC)"),
    )
    systrap, ptrace = f"ironclaw on {bare_systrap}", f"ironclaw on {bare_ptrace}"
    if bare_systrap is None or bare_ptrace is None or not {systrap, ptrace} <= set(by_way):
        why = "; ".join(problems) or "no systrap"
        return [not_measured(f"{label}, systrap", why) for _part, label in parts]
    out = [
        ms_figure(f"{label}, {systrap.removeprefix('ironclaw on ')}", by_way[systrap][part],
                  f"the same on {ptrace.removeprefix('ironclaw on ')}", by_way[ptrace][part])
        for part, label in parts
    ]  # fmt: skip
    for ours, bare_way in ((systrap, bare_systrap), (ptrace, bare_ptrace)):
        out.append(
            ms_figure(f"IronClaw message round trip, {bare_way}", by_way[ours]["trip"],
                      f"a bare sandbox on {bare_way}", by_way[bare_way]["trip"])
        )  # fmt: skip
    return out


if __name__ == "__main__":
    main()
