"""The message path: warm round trip, and aggregate throughput with latency at 1, 5, 20 and 50
sessions, each beside the same agent answering in a bare runsc sandbox, interleaved in one run.

Run inside a systemd with ironclawd installed (``make bench`` does). Defines an agent ``bench``
(mock model, rate limits out of the way) and restarts the daemon. Two ways, alternating:

- ``ironclaw``: SendMessage over the admin socket until the reply arrives on an open
  WatchReplies stream of that session (what an operator waits for): gRPC, the inbox, the
  inbound queue, the agent in gVisor asking the mock model through the proxy (budgets, audit),
  the outbound queue, ingestion into the state database, the watcher;
- ``bare`` (the baseline, benchmarks/bare.py): the same agent program and image in a bare
  ``runsc run`` of the same spec, the bench process playing the host: append to inbound.db and
  announce on the control socket, a stub model on model.sock answering at once, the reply read
  back from outbound.db with the daemon's reader. What the bare way leaves out is what the
  daemon adds: gRPC, the state database, the proxy's work, the audit log, its event loop.

(The earlier baseline, plain SQLite files without a sandbox, gRPC or model call, was a floor, not
a baseline: it is gone.)

Figures: the round trip on one warm session (``BENCH_ROUND_TRIPS`` rounds, 100), then per
session count N in ``BENCH_MSG_SESSIONS`` ("1 5 20 50"): ``BENCH_ROUNDS`` (10) bursts per way,
each of max(40, 4 N) messages spread over the N sessions and sent 8 at a time (below the admin
server's stream cap), giving the aggregate msg/s of each burst (first send to last reply) and
every message's latency (send to its reply). Writes ``results/bench-messages.json``.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from benchmarks import bare
from benchmarks.common import (
    ROUNDS,
    SOCKET_METERS_LIFTED,
    daemon_config,
    env_int,
    figure,
    interleave,
    ms_figure,
    rate_summary,
    write_result,
)
from benchmarks.sessions import host_runsc
from benchmarks.stats import summary_ms
from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from tests.harness.agents import unlimited_agent

SOCKET = "/run/ironclaw/admin.sock"
WATCHERS_PER_CONNECTION = 16
ROUND_TRIPS = env_int("BENCH_ROUND_TRIPS", 100)
LEVELS = [int(n) for n in os.environ.get("BENCH_MSG_SESSIONS", "1 5 20 50").split()]
# Below the admin server's max_concurrent_streams (refused streams come back as UNAVAILABLE).
WINDOW = 8
AGENT = "bench"
# The session's socket meters out of the way too (benchmarks/common.py).
AGENT_CONFIG = unlimited_agent(AGENT) + SOCKET_METERS_LIFTED
Done = queue.Queue[tuple[str, int, float]]  # (sid, seq answered, perf_counter seen)


class Replies:
    """One WatchReplies stream held open; every reply with the time the operator saw it
    (also used by benchmarks/mcp.py)."""

    def __init__(
        self, stub: admin_pb2_grpc.AdminServiceStub, sid: str, done: Done | None = None
    ) -> None:
        request = admin_pb2.WatchRepliesRequest(sid=sid, after_seq=0, follow=True)
        self._call = stub.WatchReplies(request)
        self.sid = sid
        self.done = done
        self.seen: queue.Queue[tuple[float, admin_pb2.Reply]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._call:
                if self.done is not None:
                    self.done.put((self.sid, item.reply.in_reply_to, time.perf_counter()))
                else:
                    self.seen.put((time.time(), item.reply))
        except grpc.RpcError:
            pass

    def wait_for(self, in_reply_to: int, timeout: float = 60) -> tuple[float, admin_pb2.Reply]:
        while True:
            seen_at, reply = self.seen.get(timeout=timeout)
            if reply.in_reply_to == in_reply_to:
                return seen_at, reply

    def close(self) -> None:
        self._call.cancel()


class IronclawSessions:
    """Sessions of the bench agent with a watcher each; replies go to ``done``."""

    def __init__(self, stub: admin_pb2_grpc.AdminServiceStub, done: Done) -> None:
        self.stub, self.done = stub, done
        self.sids: list[str] = []
        self.watchers: list[Replies] = []
        self.channels: list[grpc.Channel] = []

    def _watch_stub(self) -> admin_pb2_grpc.AdminServiceStub:
        """A connection of its own per WATCHERS_PER_CONNECTION streams: the daemon allows
        [admin] max_concurrent_streams (32) per connection, and a stream past that waits for a
        free one (at 50 sessions on one connection, CreateSession waited out its deadline)."""
        if len(self.watchers) % WATCHERS_PER_CONNECTION == 0:
            options = [("grpc.use_local_subchannel_pool", 1)]  # a new connection, not a shared one
            self.channels.append(grpc.insecure_channel(f"unix:{SOCKET}", options=options))
        return admin_pb2_grpc.AdminServiceStub(self.channels[-1])

    def grow(self, count: int) -> None:
        while len(self.sids) < count:
            created = self.stub.CreateSession(
                admin_pb2.CreateSessionRequest(agent=AGENT), timeout=120
            )
            self.sids.append(created.session.sid)
            watch = self._watch_stub()
            self.watchers.append(Replies(watch, created.session.sid, self.done))

    def send(self, index: int, text: str) -> tuple[str, int]:
        sid = self.sids[index]
        request = admin_pb2.SendMessageRequest(sid=sid, text=text, client_id=uuid.uuid4().hex)
        for _attempt in range(50):  # the same client id: a retry is queued once
            try:
                return sid, self.stub.SendMessage(request, timeout=60).seq
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                time.sleep(0.05)
        raise SystemExit(f"bench: SendMessage kept failing for {text!r}")

    def close(self) -> None:
        for watcher in self.watchers:
            watcher.close()
        for sid in self.sids:
            self.stub.RemoveSession(admin_pb2.RemoveSessionRequest(sid=sid, force=True), timeout=60)
        for channel in self.channels:
            channel.close()


class BareSessions:
    """Bare sandboxes of the same agent (benchmarks/bare.py); replies go to ``done``."""

    def __init__(self, done: Done, rootfs: Path) -> None:
        self.done, self.rootfs = done, rootfs
        self.info, self.platform = host_runsc()
        self.boxes: list[bare.BareSandbox] = []

    def grow(self, count: int) -> None:
        while len(self.boxes) < count:
            box = bare.BareSandbox(self.info, self.platform, self.rootfs, replies=self.done)
            box.start()
            box.open_messages()
            self.boxes.append(box)

    def send(self, index: int, text: str) -> tuple[str, int]:
        box = self.boxes[index]
        return box.sid, box.send(text)

    def close(self) -> None:
        for box in self.boxes:
            box.stop()


Send = Callable[[int, str], tuple[str, int]]


def burst(send: Send, done: Done, sessions: int, total: int) -> tuple[float, list[float]]:
    """``total`` messages over ``sessions`` sessions, WINDOW at a time: (msg/s from the first
    send to the last reply, each message's send-to-reply latency)."""
    sent_at: dict[tuple[str, int], float] = {}
    seen: dict[tuple[str, int], float] = {}

    def one(i: int) -> None:
        started = time.perf_counter()
        key = send(i % sessions, f"burst {i}")
        sent_at[key] = started

    first = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(WINDOW) as pool:
        list(pool.map(one, range(total)))
    pending = set(sent_at)
    while pending:
        sid, seq, at = done.get(timeout=180)
        seen[(sid, seq)] = at
        pending.discard((sid, seq))
    last = max(seen[k] for k in sent_at)
    return total / (last - first), [seen[k] - sent_at[k] for k in sent_at]


def round_trip(send: Send, done: Done) -> float:
    started = time.perf_counter()
    key = send(0, "round trip")
    while True:
        sid, seq, at = done.get(timeout=60)
        if (sid, seq) == key:
            return at - started


Way = tuple[Send, Done, Callable[[int], None]]


def _one_trip(send: Send, done: Done) -> Callable[[int], float]:
    return lambda _r: round_trip(send, done)


def bursts(
    ways: dict[str, Way], level: int, total: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """ROUNDS bursts per way, interleaved: (msg/s per burst, every message's latency)."""
    latencies: dict[str, list[float]] = {n: [] for n in ways}

    def way(name: str) -> Callable[[int], float]:
        send, done, _ = ways[name]

        def run(_r: int) -> float:
            rate, lat = burst(send, done, level, total)
            latencies[name].extend(lat)
            return rate

        return run

    return interleave({n: way(n) for n in ways}, ROUNDS, warmup=0), latencies


def measure(stub: admin_pb2_grpc.AdminServiceStub) -> dict[str, Any]:
    ours_done: Done = queue.Queue()
    bare_done: Done = queue.Queue()
    ours = IronclawSessions(stub, ours_done)
    ways: dict[str, Way] = {}
    baseline: BareSessions | None = None
    results: dict[str, Any] = {"levels": {}}
    try:
        ours.grow(1)
        baseline = BareSessions(bare_done, bare.agent_rootfs())
        baseline.grow(1)
        ways = {"ironclaw": (ours.send, ours_done, ours.grow),
                "bare": (baseline.send, bare_done, baseline.grow)}  # fmt: skip
        for send, done, _grow in ways.values():
            for _ in range(5):  # warm: channels, the agent's model channel, page caches
                round_trip(send, done)
        results["round_trip"] = interleave(
            {name: _one_trip(send, done) for name, (send, done, _) in ways.items()},
            ROUND_TRIPS,
            warmup=3,
        )
        for level in LEVELS:
            total = max(40, 4 * level)
            for send, done, grow in ways.values():
                started = time.perf_counter()
                grow(level)
                for i in range(level):  # each new session answers once before it is timed
                    key = send(i, "warm")
                    while done.get(timeout=120)[:2] != key:
                        pass
                print(f"messages: {level} sessions ready in {time.perf_counter() - started:.1f} s")
            rates, latencies = bursts(ways, level, total)
            results["levels"][level] = {"messages_per_burst": total, "rates": rates,
                                        "latencies": latencies}  # fmt: skip
    finally:
        ours.close()
        if baseline is not None:
            baseline.close()
    return results


def main() -> None:
    if not Path(SOCKET).exists():
        raise SystemExit("bench: run inside a systemd with ironclawd installed (make bench)")
    with daemon_config(AGENT_CONFIG), grpc.insecure_channel(f"unix:{SOCKET}") as channel:
        results = measure(admin_pb2_grpc.AdminServiceStub(channel))
    base = "the same agent in a bare runsc sandbox, stub model, host side in-process"
    rt = results["round_trip"]
    figures = [ms_figure("round trip, one warm session (send -> reply seen)", rt["ironclaw"],
                         base, rt["bare"])]  # fmt: skip
    summary: dict[str, Any] = {}
    for level, got in results["levels"].items():
        rates, lat = got["rates"], got["latencies"]
        figures.append(figure(f"aggregate msg/s, {level} sessions", rate_summary(rates["ironclaw"]),
                              base, rate_summary(rates["bare"]), unit="msg/s"))  # fmt: skip
        figures.append(ms_figure(f"latency under that load, {level} sessions",
                                 lat["ironclaw"], base, lat["bare"]))  # fmt: skip
        summary[level] = {
            "messages_per_burst": got["messages_per_burst"],
            "rates": {n: [round(r, 1) for r in v] for n, v in rates.items()},
            "latency": {n: summary_ms(v) for n, v in lat.items()},
        }
    write_result(
        "messages", figures, rounds=ROUNDS, round_trips=ROUND_TRIPS, levels=summary,
        notes="the bare baseline shares no daemon: its host side (queue writes, announces, the "
        "stub model, reading replies back) runs in the benchmark process; ratio > 1 on msg/s "
        "means faster than bare.",
    )  # fmt: skip


if __name__ == "__main__":
    main()
