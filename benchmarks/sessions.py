"""Session start and stop, the admin front and ``ironctl status``, each beside a baseline doing
the same work, interleaved round by round in one run.

Run inside a systemd with ironclawd installed (``make bench`` does). Per round, in rotating
order:

- ``grpc``: CreateSession(agent demo) until it returns (sandbox up in its unit and netns, the
  agent's hello received), then StopSession + RemoveSession;
- ``ironctl``: ``ironctl session create --agent demo --json`` as a process, then
  ``ironctl session stop`` + ``ironctl session rm`` (the CLI as a person runs it);
- ``bare``: the baseline (benchmarks/bare.py): the same spec (``build_spec``), image, key and
  queues, the same ``runsc run`` argv in a fresh netns made in the round, up to the same hello;
  then the same teardown. Set-up and teardown are each on their own side of the comparison.

Then, interleaved the same way: ``ironctl status`` against ``systemctl status ironclawd`` (both
processes asking a daemon for its state), and the admin front's GetStatus against the same call
straight to the internal gRPC socket (refused there for lack of a kernel identity, which still
measures the transport without the front). ``BENCH_ROUNDS`` (10), ``BENCH_CALLS`` (100).
Writes ``results/bench-sessions.json``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import grpc

from benchmarks import bare
from benchmarks.common import (
    ROUNDS,
    daemon_platform,
    env_int,
    interleave,
    ms_figure,
    timed,
    write_result,
)
from benchmarks.stats import summary_ms
from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from ironclawd.host import runsc

SOCKET = "/run/ironclaw/admin.sock"
INTERNAL = "/run/ironclaw/internal/admin-grpc.sock"
CALLS = env_int("BENCH_CALLS", 100)
STATUS_ROUNDS = env_int("BENCH_STATUS_ROUNDS", 20)


def host_runsc() -> tuple[runsc.RunscInfo, str]:
    """The host's runsc and the platform the daemon chose (its journal), else ``auto``'s."""
    info = runsc.detect(Path("/usr/bin/runsc"))
    chosen = daemon_platform().split(" ")[0]
    return info, chosen if chosen in info.platforms else runsc.choose_platform("auto", info)


def ctl(*args: str) -> str:
    proc = subprocess.run(["ironctl", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench: ironctl {' '.join(args)}: {proc.stderr.strip()[-300:]}")
    return proc.stdout


def session_ways(stub: admin_pb2_grpc.AdminServiceStub) -> dict[str, Any]:
    info, platform = host_runsc()
    created = stub.CreateSession(admin_pb2.CreateSessionRequest(agent="demo"), timeout=60)
    rootfs = bare.agent_rootfs()
    stub.RemoveSession(admin_pb2.RemoveSessionRequest(sid=created.session.sid, force=True))

    def grpc_way(_r: int) -> dict[str, float]:
        holder: dict[str, str] = {}

        def create() -> None:
            reply = stub.CreateSession(admin_pb2.CreateSessionRequest(agent="demo"), timeout=60)
            holder["sid"] = reply.session.sid

        def stop_rm() -> None:
            stub.StopSession(admin_pb2.StopSessionRequest(sid=holder["sid"]), timeout=60)
            stub.RemoveSession(admin_pb2.RemoveSessionRequest(sid=holder["sid"]), timeout=60)

        return {"grpc_create": timed(create), "grpc_stop_rm": timed(stop_rm)}

    def ctl_way(_r: int) -> dict[str, float]:
        holder: dict[str, str] = {}

        def create() -> None:
            holder["sid"] = json.loads(ctl("session", "create", "--agent", "demo", "--json"))["sid"]

        def stop_rm() -> None:
            ctl("session", "stop", holder["sid"])
            ctl("session", "rm", holder["sid"])

        return {"ctl_create": timed(create), "ctl_stop_rm": timed(stop_rm)}

    def bare_way(_r: int) -> dict[str, float]:
        box = bare.BareSandbox(info, platform, rootfs)
        took = {"bare_create": timed(box.start), "bare_stop": timed(box.stop)}
        return {**took, "bare_setup_part": box.steps["set-up"]}

    samples = interleave({"grpc": grpc_way, "ironctl": ctl_way, "bare": bare_way}, ROUNDS)
    return {"platform": platform, "rootfs": str(rootfs), "samples": samples}


def status_ways() -> dict[str, list[float]]:
    def run(*argv: str) -> float:
        done: list[subprocess.CompletedProcess[bytes]] = []
        took = timed(lambda: done.append(subprocess.run(argv, capture_output=True, check=False)))
        if done[0].returncode != 0:  # a refusal ends fast: it is no timing of a status
            tail = done[0].stderr.decode(errors="replace").strip()[-300:]
            raise SystemExit(f"bench: {' '.join(argv)} exited {done[0].returncode}: {tail}")
        return took

    return interleave(
        {
            "ctl_status": lambda _r: run("ironctl", "status"),
            "systemctl_status": lambda _r: run("systemctl", "status", "--no-pager", "ironclawd"),
        },
        STATUS_ROUNDS,
    )


def admin_ways() -> dict[str, list[float]]:
    with (
        grpc.insecure_channel(f"unix:{SOCKET}") as front,
        grpc.insecure_channel(f"unix:{INTERNAL}") as internal,
    ):
        front_stub = admin_pb2_grpc.AdminServiceStub(front)
        internal_stub = admin_pb2_grpc.AdminServiceStub(internal)

        def via_front(_r: int) -> float:
            return timed(lambda: front_stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=10))

        def direct(_r: int) -> float:
            def call() -> None:
                try:
                    internal_stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=10)
                except grpc.RpcError as err:
                    if err.code() != grpc.StatusCode.UNAUTHENTICATED:
                        raise

            return timed(call)

        return interleave({"front": via_front, "internal": direct}, CALLS, warmup=5)


def main() -> None:
    if not Path(SOCKET).exists():
        raise SystemExit("bench: run inside a systemd with ironclawd installed (make bench)")
    with grpc.insecure_channel(f"unix:{SOCKET}") as channel:
        ways = session_ways(admin_pb2_grpc.AdminServiceStub(channel))
    s = ways["samples"]
    bare_name = f"bare runsc run, same spec, fresh netns, to the agent's hello ({ways['platform']})"
    status = status_ways()
    admin = admin_ways()
    figures = [
        ms_figure("session create (gRPC CreateSession)", s["grpc_create"], bare_name,
                  s["bare_create"]),
        ms_figure("session create (ironctl session create)", s["ctl_create"], bare_name,
                  s["bare_create"]),
        ms_figure("session stop + rm (gRPC)", s["grpc_stop_rm"],
                  "bare teardown (runsc delete, netns, bundle, key, queues)", s["bare_stop"]),
        ms_figure("session stop + rm (ironctl, two processes)", s["ctl_stop_rm"],
                  "bare teardown (runsc delete, netns, bundle, key, queues)", s["bare_stop"]),
        ms_figure("ironctl status", status["ctl_status"], "systemctl status ironclawd",
                  status["systemctl_status"]),
        ms_figure("admin GetStatus through the public front", admin["front"],
                  "the same call on the internal socket (refused: no identity)", admin["internal"]),
    ]  # fmt: skip
    write_result(
        "sessions", figures, rounds=ROUNDS, rootfs=ways["rootfs"],
        bare_setup_before_runsc=summary_ms(s["bare_setup_part"]),
    )  # fmt: skip


if __name__ == "__main__":
    main()
