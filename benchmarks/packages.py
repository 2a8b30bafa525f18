"""Packages (issue 14): building a per-agent image for ``jq``, a cold session on it beside one on
the base image, and a program started in gVisor beside a tool that starts none, in one run.

Run inside a systemd with ironclawd installed (``make bench``, or ``make bench BENCH=packages``
for this one alone). Needs apt's lists and the Debian archive (the downloads are real). Measured,
the ways interleaved round by round so that drift on a shared machine hits all alike:

- ``resolve``: ``AptPackageImages.resolve(["jq"])`` with the real ``HelperRunner`` (apt's
  simulation in its own unprivileged unit with no network, then the domain's policy checks); the
  base's fake dpkg status is made once, before the rounds.
- ``image_build``: ``AptPackageImages.image(...)`` for the resolved set, from scratch (the image
  collected after each round; resolve excluded): download of the three ``.deb`` (jq, libjq1,
  libonig5; one ``apt-get download`` unit for all three, from the archive) and their size + SHA-256
  re-check, one unpack unit each, the image assembled and renamed into place. Its parts, from
  timing each helper step: ``download`` (the one unit), ``unpack`` (the three units) and
  ``assemble_and_rest`` (the total minus both: the hash re-checks, ``dpkg -L`` for the base
  packages' libraries, extraction with the checks, the copy of the base, the rename).
- ``approve_jq``: once, ``ironctl change approve`` of the agent's real ``package add jq`` change
  (the daemon downloads, unpacks and builds the image, then applies).
- ``session_start_jq_image`` beside ``session_start_base_image``: CreateSession over the admin
  socket up to its answer (sandbox running in its unit and netns, agent connected) for two
  agents of the same config, one granted jq through the gateway; stopped and removed after each,
  one uncounted round first.
- ``tool_run_jq`` beside ``tool_list_files`` and ``no_tool``: on one session of the jq agent,
  ``/tool run {"program": "jq", "args": ["-n", "1+1"]}`` sent and its reply seen, against
  ``/tool list_files {}`` (a tool run in the box with no process start) and a plain message (one
  model turn): the difference is what starting a program in gVisor costs.

Prints medians and p90 and writes ``results/bench-packages.json``; no assertion on any timing.
Latest run (2 shared cores, nothing else running; median / p90 ms), with one download unit for
the whole set (the first run, one unit per ``.deb``, built the image in 6721 ms, 5812 of them
downloading):

    resolve                       4067.0    4135.1   (apt builds its cache in memory each time)
    image_build                   2514.4    2670.6
      download                    1870.0    1878.2   (1 unit: apt's CPU, not the network)
      unpack                       641.9     653.1   (3 units)
      assemble_and_rest            129.1     133.4
    approve_jq (once)             3.25 s
    session_start_jq_image        1057.4    1262.1
    session_start_base_image      1067.5    1223.5   (-10 ms; +23 and -28 in earlier runs: noise)
    tool_run_jq                   212.83    246.22
    tool_list_files                39.54     45.74   (so ~173 ms to start jq in gVisor)
    no_tool                        30.76     38.16

The apt steps are apt's own CPU: as ``nobody`` on the host, ``apt-get download jq`` takes 2.1 s
(1.85 s user) for a 64 KB file, ``apt-get -s install jq`` 3.4 s (3.2 s user). The whole
benchmark takes ~2 minutes (``BENCH_PKG_BUILDS``, ``BENCH_PKG_SESSIONS``, ``BENCH_PKG_CALLS``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from benchmarks.common import daemon_config, write_doc
from benchmarks.mcp import Sandbox
from benchmarks.stats import summary_ms
from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from ironclawd.bundle.packages import AptPackageImages, Steps
from ironclawd.host.pkg_runner import HelperRunner
from tests.harness.agents import unlimited_agent

ROOT = Path(__file__).resolve().parents[1]
SOCKET = "/run/ironclaw/admin.sock"
ROOTFS_DIR = Path("/var/lib/ironclaw/rootfs")
BUILDS = int(os.environ.get("BENCH_PKG_BUILDS", "5"))
SESSIONS = int(os.environ.get("BENCH_PKG_SESSIONS", "10"))
CALLS = int(os.environ.get("BENCH_PKG_CALLS", "20"))
WARMUP = 3
JQ_AGENT, BASE_AGENT = "bench-pkg", "bench-base"
RUN_JQ = json.dumps({"program": "jq", "args": ["-n", "1+1"]})


class TimedSteps:
    """The real helper steps, each call's time added to its step's total."""

    def __init__(self, inner: Steps) -> None:
        self._inner = inner
        self.spent: dict[str, float] = {}

    def run(self, step: str, args: Sequence[str], stdin: bytes = b"", *,
            network: bool = False) -> bytes:  # fmt: skip
        t0 = time.perf_counter()
        try:
            return self._inner.run(step, args, stdin, network=network)
        finally:
            self.spent[step] = self.spent.get(step, 0.0) + time.perf_counter() - t0


def _base_rootfs() -> Path:
    images = [p for p in sorted(ROOTFS_DIR.glob("*")) if p.is_dir() and "unavailable" not in p.name]
    if not images:
        raise SystemExit("bench: run inside a systemd with ironclawd installed (make bench)")
    return images[0]


def image_builds(base: Path) -> dict[str, list[float]]:
    """Resolve and build-from-scratch rounds, interleaved; the build's parts from its steps."""
    samples: dict[str, list[float]] = {
        k: [] for k in ("resolve", "image_build", "download", "unpack", "assemble_and_rest")
    }
    steps = TimedSteps(HelperRunner())
    with tempfile.TemporaryDirectory(prefix="ironclaw-bench-pkg-") as tmp:
        images = AptPackageImages(base, Path(tmp) / "images", steps)
        resolved = images.resolve(["jq"])  # also the base's fake dpkg status, made once
        names = sorted(p.name for p in resolved)
        if "jq" not in names:
            raise SystemExit(f"bench-packages: jq resolved to {names}")
        for i in range(BUILDS):
            for way in ("resolve", "image_build")[i % 2 :] + ("resolve", "image_build")[: i % 2]:
                steps.spent.clear()
                t0 = time.perf_counter()
                if way == "resolve":
                    images.resolve(["jq"])
                    samples["resolve"].append(time.perf_counter() - t0)
                    continue
                image = images.image(resolved)
                took = time.perf_counter() - t0
                if not (image / "usr/bin/jq").is_file():
                    raise SystemExit(f"bench-packages: no usr/bin/jq in {image}")
                samples["image_build"].append(took)
                samples["download"].append(steps.spent["download"])
                samples["unpack"].append(steps.spent["unpack"])
                samples["assemble_and_rest"].append(
                    took - steps.spent["download"] - steps.spent["unpack"]
                )
                if images.collect([], []) != [image.name]:
                    raise SystemExit(f"bench-packages: {image} was not collected")
    return samples


def _ctl(*args: str) -> dict[str, Any]:
    proc = subprocess.run(["ironctl", "--json", *args], capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"bench-packages: ironctl {' '.join(args)}: {proc.stdout}{proc.stderr}")
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def grant_jq() -> float:
    """``ironctl package add jq`` for JQ_AGENT, approved as the operator would: the approval's
    seconds (the daemon's download, unpack and build, then the apply)."""
    change = _ctl("package", "add", "jq", "--agent", JQ_AGENT, "--reason", "benchmark")
    t0 = time.perf_counter()
    applied = _ctl("change", "approve", change["id"], "--yes")
    took = time.perf_counter() - t0
    if applied.get("state") != "applied":
        raise SystemExit(f"bench-packages: the jq change ended {applied}")
    return took


def session_starts(stub: admin_pb2_grpc.AdminServiceStub) -> dict[str, list[float]]:
    ways = {"session_start_jq_image": JQ_AGENT, "session_start_base_image": BASE_AGENT}
    samples: dict[str, list[float]] = {name: [] for name in ways}
    order = list(ways)
    for i in range(1 + SESSIONS):  # round 0 uncounted
        for name in order[i % 2 :] + order[: i % 2]:
            t0 = time.perf_counter()
            reply = stub.CreateSession(
                admin_pb2.CreateSessionRequest(agent=ways[name]), timeout=120
            )
            took = time.perf_counter() - t0
            sid = reply.session.sid
            stub.StopSession(admin_pb2.StopSessionRequest(sid=sid), timeout=60)
            stub.RemoveSession(admin_pb2.RemoveSessionRequest(sid=sid), timeout=60)
            if i > 0:
                samples[name].append(took)
    return samples


def tool_calls(sandbox: Sandbox) -> dict[str, list[float]]:
    ways = {  # the message sent, how its reply starts
        "tool_run_jq": (f"/tool run {RUN_JQ}", "tool run said: exit code 0"),
        "tool_list_files": ("/tool list_files {}", "tool list_files said: "),
        "no_tool": ("one plus one?", "mock: one plus one?"),
    }
    samples: dict[str, list[float]] = {name: [] for name in ways}
    order = list(ways)
    for i in range(WARMUP + CALLS):
        for name in order[i % len(order) :] + order[: i % len(order)]:
            took = sandbox.round_trip(*ways[name])
            if i >= WARMUP:
                samples[name].append(took)
    return samples


def in_daemon() -> dict[str, Any]:
    """The two agents configured, jq granted the real way, then sessions and tool calls."""
    tables = unlimited_agent(JQ_AGENT, tools=("list_files", "run"))
    with daemon_config(tables + unlimited_agent(BASE_AGENT, ("list_files",))):
        approve_seconds = grant_jq()
        with grpc.insecure_channel(f"unix:{SOCKET}") as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)
            starts = session_starts(stub)
            sid = stub.CreateSession(admin_pb2.CreateSessionRequest(agent=JQ_AGENT), timeout=120)
            sandbox = Sandbox(stub, sid.session.sid, "bench-packages")
            try:
                calls = tool_calls(sandbox)
            finally:
                sandbox.replies.close()
                request = admin_pb2.RemoveSessionRequest(sid=sandbox.sid, force=True)
                stub.RemoveSession(request, timeout=60)
    return {"approve_jq_s": round(approve_seconds, 2), "starts": starts, "calls": calls}


def _line(name: str, s: dict[str, float]) -> str:
    return f"  {name:<26} {s['median_ms']:>9} {s['p90_ms']:>9}"


def main() -> int:
    if not Path(SOCKET).exists():
        raise SystemExit("bench: run inside a systemd with ironclawd installed (make bench)")
    builds = image_builds(_base_rootfs())
    daemon = in_daemon()
    build = {k: summary_ms(v, 1) for k, v in builds.items()}
    starts = {k: summary_ms(v, 1) for k, v in daemon["starts"].items()}
    calls = {k: summary_ms(v, 2) for k, v in daemon["calls"].items()}

    def diff(group: dict[str, dict[str, float]], a: str, b: str) -> float:
        return round(group[a]["median_ms"] - group[b]["median_ms"], 2)

    added = {
        "session_start_jq_over_base": diff(starts, "session_start_jq_image",
                                           "session_start_base_image"),
        "run_jq_over_list_files": diff(calls, "tool_run_jq", "tool_list_files"),
    }  # fmt: skip
    report = {"builds": BUILDS, "sessions": SESSIONS, "calls": CALLS, "image": build,
              "approve_jq_s": daemon["approve_jq_s"], "session_start": starts,
              "tools": calls, "added_median_ms": added}  # fmt: skip
    out = write_doc("packages", report)
    print(f"jq image, {BUILDS} rounds each, resolve and build interleaved (median / p90 ms):")
    print("\n".join(_line(name, s) for name, s in build.items()))
    print(f"approval of the jq change (daemon: build + apply), once: {daemon['approve_jq_s']} s")
    print(f"cold session start, {SESSIONS} rounds each, interleaved (median / p90 ms):")
    print("\n".join(_line(name, s) for name, s in starts.items()))
    print(f"tools on one jq session, {CALLS} calls each, interleaved (median / p90 ms):")
    print("\n".join(_line(name, s) for name, s in calls.items()))
    print("added (median ms): " + ", ".join(f"{k} {v}" for k, v in added.items()))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
