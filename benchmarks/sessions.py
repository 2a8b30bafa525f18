"""Session start/stop latency and admin-call latency, each beside a baseline from the same run.

Run inside a systemd with ironclawd installed (``make bench`` does: scripts/with-systemd +
scripts/install-dev). Prints medians and writes ``results/bench-sessions.json``.

Baselines:
- ``runsc run`` of the same agent rootfs, bare (no unit, no netns, no bundle writing): the
  agent starts, prints its usage (``-h``) and exits. IronClaw's figure is CreateSession returning
  (sandbox up in its unit and netns, agent connected), so the difference is what IronClaw adds.
- Admin ``GetStatus`` straight to the internal gRPC socket (root only) vs through the public
  socket's peer-credential front.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from benchmarks.stats import summary_ms
from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from ironclawd.bundle.spec import SOCKETS_DIR, build_spec, netns_path
from ironclawd.bundle.writer import write_bundle
from ironclawd.domain.agents import AGENT_GID, AGENT_UID
from ironclawd.domain.policy import Mount, SandboxPolicy

RESULTS = Path(__file__).resolve().parents[1] / "results"
ROOTFS_DIR = Path("/var/lib/ironclaw/rootfs")
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "15"))
CALLS = int(os.environ.get("BENCH_CALLS", "300"))


def _ms(samples: list[float]) -> dict[str, float]:
    return summary_ms(samples)


def bare_runsc(rootfs: Path) -> list[float]:
    """The very spec ironclawd would write (``build_spec``), run by hand with ``runsc run`` in a
    netns made with ``ip netns add``: no daemon, no unit, no control socket."""
    sid = "benchbare0001"
    sockets = Path("/run/ironclaw/sessions") / sid
    sockets.mkdir(parents=True, exist_ok=True)
    netns = f"ironclaw-{sid}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    policy = SandboxPolicy(
        sid=sid, agent="demo", uid=AGENT_UID, gid=AGENT_GID, host_uid=AGENT_UID,
        host_gid=AGENT_GID, rootfs=str(rootfs), netns=netns_path(sid),
        argv=("/app/agent/agent", "-h"), mounts=(Mount(SOCKETS_DIR, str(sockets)),),
    )  # fmt: skip
    samples = []
    try:
        with tempfile.TemporaryDirectory(prefix="ironclaw-bench-") as tmp:
            bundle = Path(tmp) / "bundle"
            spec = build_spec(policy)
            # Outside a unit there is no cgroup of its own for runsc to configure (it fails on
            # the harness's partial cgroup v1 mounts): limits and cgroups are off for the baseline.
            del spec["linux"]["resources"]
            write_bundle(bundle, spec)
            for i in range(ROUNDS):
                argv = ["ip", "netns", "exec", netns, "runsc", f"--root={tmp}/state",
                        "--network=none", "--platform=ptrace", "--ignore-cgroups",
                        "--host-uds=open", "run", "--bundle", str(bundle),
                        f"bench-{i}"]  # fmt: skip
                started = time.perf_counter()
                proc = subprocess.run(argv, capture_output=True, text=True, check=False)
                samples.append(time.perf_counter() - started)
                if proc.returncode != 0:
                    raise SystemExit(f"bench: bare runsc run failed: {proc.stderr[-400:]}")
    finally:
        subprocess.run(["ip", "netns", "delete", netns], check=False)
        shutil.rmtree(sockets, ignore_errors=True)
    return samples


def sessions(stub: admin_pb2_grpc.AdminServiceStub) -> tuple[list[float], list[float]]:
    create, stop_rm = [], []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        reply = stub.CreateSession(admin_pb2.CreateSessionRequest(agent="demo"), timeout=60)
        create.append(time.perf_counter() - started)
        sid = reply.session.sid
        started = time.perf_counter()
        stub.StopSession(admin_pb2.StopSessionRequest(sid=sid), timeout=60)
        stub.RemoveSession(admin_pb2.RemoveSessionRequest(sid=sid), timeout=60)
        stop_rm.append(time.perf_counter() - started)
    return create, stop_rm


def admin_calls(path: str) -> list[float]:
    with grpc.insecure_channel(f"unix:{path}") as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=10)  # channel set-up
        samples = []
        for _ in range(CALLS):
            started = time.perf_counter()
            stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=10)
            samples.append(time.perf_counter() - started)
    return samples


def internal_calls(path: str) -> list[float] | None:
    """The same call straight to the internal server; it refuses (no kernel identity), which
    still measures the transport without the front. None if it cannot be reached."""
    with grpc.insecure_channel(f"unix:{path}") as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        samples = []
        for _ in range(CALLS):
            started = time.perf_counter()
            try:
                stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=10)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAUTHENTICATED:
                    return None
            samples.append(time.perf_counter() - started)
    return samples


def main() -> None:
    images = sorted(p for p in ROOTFS_DIR.iterdir() if p.is_dir()) if ROOTFS_DIR.is_dir() else []
    rootfs = images[0] if images else None
    if rootfs is None or shutil.which("runsc") is None:
        raise SystemExit("bench: run inside a systemd with ironclawd installed (make bench)")
    report: dict[str, Any] = {
        "rounds": ROUNDS,
        "calls": CALLS,
        "runsc": subprocess.run(
            ["runsc", "--version"], capture_output=True, text=True, check=True
        ).stdout.split()[2],
    }
    report["bare_runsc_run_probe"] = _ms(bare_runsc(rootfs))
    with grpc.insecure_channel("unix:/run/ironclaw/admin.sock") as channel:
        create, stop_rm = sessions(admin_pb2_grpc.AdminServiceStub(channel))
    report["ironclaw_create_session"] = _ms(create)
    report["ironclaw_stop_and_remove"] = _ms(stop_rm)
    report["admin_get_status_via_front"] = _ms(admin_calls("/run/ironclaw/admin.sock"))
    internal = internal_calls("/run/ironclaw/internal/admin-grpc.sock")
    if internal:
        report["admin_call_direct_to_internal_baseline"] = _ms(internal)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "bench-sessions.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    width = max(len(k) for k in report)
    for key, value in report.items():
        shown = (
            f"median {value['median_ms']} ms (p90 {value['p90_ms']}, n={value['n']})"
            if (isinstance(value, dict))
            else value
        )
        print(f"{key:<{width}}  {shown}")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
