"""Pooled engage against cold engage: a new conversation's first reply, with a warm pool and
without, interleaved in one run.

Run inside a systemd with ironclawd installed (``make bench`` does). Two agents alike (mock
model, limits out of the way): ``bench-pool`` gets a warm pool (``[pool] size = 2``,
``agents = ["bench-pool"]``), ``bench-cold`` none, so both ways run against the same daemon in
the same rounds. Engage = ``ironctl session create --agent A --json`` then ``ironctl send SID
TEXT`` until it prints the reply (two processes, as a person or script does); the same in one
process, ``ironctl chat --agent A`` with the message on standard input (it starts the session,
prints the reply and ends at the end of its input); and the same over gRPC (CreateSession, then
SendMessage until the reply arrives on WatchReplies). Before every
round of every way the benchmark waits (untimed) until the pool is full again: the figure is a
claim, not a pool that ran dry, and no refill runs into the next round (the cold twin's
included). Sessions are removed after each round (untimed).

Then what a waiting pooled sandbox costs while nobody claims it: the CPU of the pool's ready
sandboxes (every process of their units, from /proc/<pid>/stat) over ``BENCH_IDLE_SECONDS``
(10) s, per sandbox, beside that of as many idle sessions of the cold agent (created, never sent
a message) measured over the same seconds.

On a checkout without ``[pool]`` in its configuration schema the figures say "not measured".
Writes ``results/bench-pool.json``.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from benchmarks.common import (
    ROUNDS,
    Way,
    daemon_config,
    env_int,
    figure,
    interleave,
    ms_figure,
    not_measured,
    timed,
    write_result,
)
from benchmarks.density import TICKS, cpu_ticks, require_pids, sandbox_pids
from benchmarks.messages import Replies
from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from ironclawd import config
from tests.harness.agents import unlimited_agent

SOCKET = "/run/ironclaw/admin.sock"
POOLED, COLD = "bench-pool", "bench-cold"
POOL_SIZE = 2
POOL_CONFIG = f'\n[pool]\nsize = {POOL_SIZE}\nagents = ["{POOLED}"]\nmin_available_bytes = 0\n'
IDLE_SECONDS = env_int("BENCH_IDLE_SECONDS", 10)


def ctl(*args: str) -> str:
    proc = subprocess.run(["ironctl", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench: ironctl {' '.join(args)}: {proc.stderr.strip()[-300:]}")
    return proc.stdout


def chat(agent: str) -> str:
    """``ironctl chat --agent A`` with one message on standard input, to its end (the reply
    printed); the id of the session it started (its standard error names it)."""
    proc = subprocess.run(["ironctl", "chat", "--agent", agent], input="hello\n",
                          capture_output=True, text=True, check=False)  # fmt: skip
    started = re.search(r"started session ([a-z0-9]+) of agent", proc.stderr)
    if proc.returncode != 0 or not proc.stdout.strip() or started is None:
        raise SystemExit(f"bench: ironctl chat --agent {agent}: {proc.stderr.strip()[-300:]}")
    return started.group(1)


def ready_pooled(stub: admin_pb2_grpc.AdminServiceStub, agent: str) -> int:
    """How many sandboxes the pool holds ready for ``agent`` (GetStatus, else the journal)."""
    status = stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=10)
    for row in getattr(status, "pool", ()):
        if row.agent == agent:
            return int(row.ready)
    return len(ready_pooled_sids(agent))


def ready_pooled_sids(agent: str) -> list[str]:
    """The ids of ``agent``'s pooled sandboxes that are ready and unclaimed (the journal)."""
    log = subprocess.run(
        ["journalctl", "-u", "ironclawd", "-o", "cat", "--no-pager", "-b"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    log = log.rsplit("serving admin API", 1)[-1]
    ready = re.findall(rf"pool: sandbox ([a-z0-9]+) of agent {re.escape(agent)} ready", log)
    gone = set(re.findall(r"pool: stopping sandbox ([a-z0-9]+)", log))
    gone |= set(re.findall(r"session ([a-z0-9]+) running in a pooled sandbox", log))
    return [s for s in ready if s not in gone]


def wait_ready(stub: admin_pb2_grpc.AdminServiceStub, agent: str = POOLED,
               want: int = POOL_SIZE, timeout: float = 120) -> None:  # fmt: skip
    """Untimed, before every round of every way: until the pool is full again. Waiting for one
    ready sandbox left the refill of the other (a sandbox's start, ~1 s of both cores) running
    into the next round, often the cold twin's, which it slowed (found by a review, stop 50)."""
    deadline = time.monotonic() + timeout
    while ready_pooled(stub, agent) < want:
        if time.monotonic() > deadline:
            raise SystemExit(
                f"bench: the pool of {agent} did not hold {want} ready sandboxes within "
                f"{timeout:g} s"
            )
        time.sleep(0.05)


def ways(stub: admin_pb2_grpc.AdminServiceStub) -> dict[str, Way]:
    def by_ctl(agent: str) -> Way:
        def run(_r: int) -> dict[str, float]:
            wait_ready(stub)
            holder: dict[str, str] = {}

            def create() -> None:
                holder["sid"] = json.loads(ctl("session", "create", "--agent", agent, "--json"))[
                    "sid"
                ]

            took_create = timed(create)
            took_send = timed(lambda: ctl("send", holder["sid"], "hello"))
            ctl("session", "rm", "--force", holder["sid"])
            return {f"ctl {agent}": took_create + took_send, f"ctl create {agent}": took_create}

        return run

    def by_chat(agent: str) -> Way:
        def run(_r: int) -> dict[str, float]:
            wait_ready(stub)
            started = time.perf_counter()
            sid = chat(agent)
            took = time.perf_counter() - started
            ctl("session", "rm", "--force", sid)
            return {f"chat {agent}": took}

        return run

    def by_grpc(agent: str) -> Way:
        def run(_r: int) -> dict[str, float]:
            wait_ready(stub)
            started = time.perf_counter()
            sid = stub.CreateSession(
                admin_pb2.CreateSessionRequest(agent=agent), timeout=120
            ).session.sid
            created = time.perf_counter() - started
            replies = Replies(stub, sid)
            try:
                request = admin_pb2.SendMessageRequest(
                    sid=sid, text="hello", client_id=uuid.uuid4().hex
                )
                replies.wait_for(stub.SendMessage(request, timeout=60).seq)
                took = time.perf_counter() - started
            finally:
                replies.close()
                stub.RemoveSession(admin_pb2.RemoveSessionRequest(sid=sid, force=True))
            return {f"grpc {agent}": took, f"grpc create {agent}": created}

        return run

    return {
        "ctl pooled": by_ctl(POOLED),
        "ctl cold": by_ctl(COLD),
        "chat pooled": by_chat(POOLED),
        "chat cold": by_chat(COLD),
        "grpc pooled": by_grpc(POOLED),
        "grpc cold": by_grpc(COLD),
    }


def waiting_cpu(stub: admin_pb2_grpc.AdminServiceStub) -> list[dict[str, Any]]:
    """CPU per sandbox of the pool's waiting sandboxes and of as many idle sessions, over the
    same seconds (% of one core)."""
    deadline = time.monotonic() + 120
    while len(pooled := ready_pooled_sids(POOLED)) < POOL_SIZE:
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: the pool of {POOLED} did not refill within 120 s")
        time.sleep(0.2)
    idle = [
        stub.CreateSession(admin_pb2.CreateSessionRequest(agent=COLD), timeout=120).session.sid
        for _ in pooled
    ]
    try:
        time.sleep(2)  # past the agents' start-up
        ways = {
            "pooled": require_pids(sandbox_pids(pooled), f"the pooled sandboxes {pooled}"),
            "idle": require_pids(sandbox_pids(idle), f"the idle sessions {idle}"),
        }
        before = {k: sum(cpu_ticks(p) for p in pids) for k, pids in ways.items()}
        time.sleep(IDLE_SECONDS)
        used = {
            k: 100 * (sum(cpu_ticks(p) for p in pids) - before[k]) / TICKS / IDLE_SECONDS
            for k, pids in ways.items()
        }
    finally:
        for sid in idle:
            stub.RemoveSession(admin_pb2.RemoveSessionRequest(sid=sid, force=True))
    per = {k: {"median": round(v / len(pooled), 2)} for k, v in used.items()}
    return [
        figure(
            f"CPU of a waiting pooled sandbox ({len(pooled)} measured over {IDLE_SECONDS} s)",
            per["pooled"],
            f"an idle session's sandbox, agent {COLD} (same seconds)",
            per["idle"],
            unit="% of a core",
        )
    ]


def figures(s: dict[str, list[float]]) -> list[dict[str, Any]]:
    cold = f"the same, agent {COLD} without a pool (cold start)"
    return [
        ms_figure(
            "pooled engage: ironctl session create + ironctl send, first reply",
            s[f"ctl {POOLED}"],
            cold,
            s[f"ctl {COLD}"],
        ),
        ms_figure(
            "pooled engage in one command: ironctl chat --agent A, first reply",
            s[f"chat {POOLED}"],
            cold,
            s[f"chat {COLD}"],
        ),
        ms_figure(
            "pooled ironctl session create alone",
            s[f"ctl create {POOLED}"],
            cold,
            s[f"ctl create {COLD}"],
        ),
        ms_figure(
            "pooled engage over gRPC: CreateSession + SendMessage, first reply",
            s[f"grpc {POOLED}"],
            cold,
            s[f"grpc {COLD}"],
        ),
        ms_figure(
            "pooled CreateSession alone", s[f"grpc create {POOLED}"], cold, s[f"grpc create {COLD}"]
        ),
    ]


def main() -> None:
    if not Path(SOCKET).exists():
        raise SystemExit("bench: run inside a systemd with ironclawd installed (make bench)")
    if "pool" not in config.SCHEMA:
        why = "this checkout has no [pool] configuration (issue 17 item 1 not landed)"
        write_result("pool", [not_measured("pooled engage (ironctl), first reply", why)])
        return
    extra = unlimited_agent(POOLED) + unlimited_agent(COLD) + POOL_CONFIG
    with daemon_config(extra), grpc.insecure_channel(f"unix:{SOCKET}") as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        samples = interleave(ways(stub), ROUNDS)
        waiting = waiting_cpu(stub)
    write_result("pool", figures(samples) + waiting, rounds=ROUNDS, pool_config=POOL_CONFIG.strip())


if __name__ == "__main__":
    main()
