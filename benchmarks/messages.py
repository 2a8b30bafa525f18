"""The message path: warm round trip and messages per second each way, beside plain SQLite.

Run inside a systemd with ironclawd installed (``make bench`` does). Defines an agent ``bench``
with rate limits out of the way (the demo agent allows 60 model requests a minute), restarts
the daemon, and measures against a real sandbox answering through the host's mock model:

- round trip: SendMessage -> the reply arriving on an open WatchReplies stream (what an operator
  waits for), one message at a time on a warm session; median over ROUND_TRIPS.
- inbound: a burst of BURST pipelined sends; from the first send until the agent has read and
  answered each one (the reply row's created_at, stamped by the agent as it writes it).
- outbound: the same burst; from the agent writing each reply until the operator sees it
  (ingested into the state DB, streamed).

Baselines, measured in the same run: the same one-writer/one-reader pattern on unencrypted
SQLite files in a temporary directory (stdlib sqlite3, rollback journal, synchronous=FULL, the
reader re-opening read-only per announce, announces over a pipe), no sandbox, no gRPC, no model.
Prints figures and writes ``results/bench-messages.json``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import queue
import sqlite3
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from benchmarks.stats import summary_ms
from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from tests.harness.agents import unlimited_agent

RESULTS = Path(__file__).resolve().parents[1] / "results"
SOCKET = "/run/ironclaw/admin.sock"
CONFIG = Path("/etc/ironclaw/ironclawd.toml")
ROUND_TRIPS = int(os.environ.get("BENCH_ROUND_TRIPS", "300"))
BURST = int(os.environ.get("BENCH_BURST", "2000"))
# Below the admin server's max_concurrent_streams (refused streams come back as UNAVAILABLE).
WINDOW = 8
AGENT = "bench"
AGENT_CONFIG = unlimited_agent(AGENT)


def _ms(samples: list[float]) -> dict[str, float]:
    return summary_ms(samples)


class Replies:
    """One WatchReplies stream held open; every reply with the time the operator saw it."""

    def __init__(self, stub: admin_pb2_grpc.AdminServiceStub, sid: str) -> None:
        request = admin_pb2.WatchRepliesRequest(sid=sid, after_seq=0, follow=True)
        self._call = stub.WatchReplies(request)
        self.seen: queue.Queue[tuple[float, admin_pb2.Reply]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._call:
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


def ironclaw_figures(stub: admin_pb2_grpc.AdminServiceStub) -> dict[str, Any]:
    created = stub.CreateSession(admin_pb2.CreateSessionRequest(agent=AGENT), timeout=60)
    sid = created.session.sid
    replies = Replies(stub, sid)
    report: dict[str, Any] = {}
    try:

        def send(text: str) -> tuple[float, admin_pb2.SendMessageResponse]:
            started = time.time()
            request = admin_pb2.SendMessageRequest(sid=sid, text=text, client_id=uuid.uuid4().hex)
            for _attempt in range(20):  # the same client id: a retry is queued once
                try:
                    return started, stub.SendMessage(request, timeout=60)
                except grpc.RpcError as err:
                    if err.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    time.sleep(0.05)
            raise SystemExit(f"bench: SendMessage kept failing for {text!r}")

        for i in range(20):  # warm: channels, the agent's model channel, page caches
            replies.wait_for(send(f"warm {i}")[1].seq)
        samples = []
        for i in range(ROUND_TRIPS):
            started = time.perf_counter()
            sent = send(f"round trip {i}")[1]
            replies.wait_for(sent.seq)
            samples.append(time.perf_counter() - started)
        report["round_trip"] = _ms(samples)

        with concurrent.futures.ThreadPoolExecutor(WINDOW) as pool:
            sends = list(pool.map(send, (f"burst {i}" for i in range(BURST))))
        first_send = min(s for s, _ in sends)
        last_seq = max(r.seq for _, r in sends)
        seen = []
        while True:
            seen_at, reply = replies.seen.get(timeout=120)
            seen.append((seen_at, reply.created_at))
            if reply.in_reply_to == last_seq:
                break
        seen = seen[-BURST:]
        agent_done = max(c for _, c in seen)
        first_written = min(c for _, c in seen)
        last_seen = max(s for s, _ in seen)
        report["inbound_msgs_per_s"] = round(BURST / (agent_done - first_send), 1)
        report["outbound_msgs_per_s"] = round(BURST / (last_seen - first_written), 1)
        report["end_to_end_msgs_per_s"] = round(BURST / (last_seen - first_send), 1)
        report["outbound_latency"] = _ms([max(0.0, s - c) for s, c in seen])
    finally:
        replies.close()
        stub.RemoveSession(admin_pb2.RemoveSessionRequest(sid=sid, force=True), timeout=60)
    return report


# -- the plain SQLite baseline ------------------------------------------------------------


def _plain_writer(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode = DELETE")
    db.execute("PRAGMA synchronous = FULL")
    db.execute(
        "CREATE TABLE IF NOT EXISTS messages (seq INTEGER PRIMARY KEY, created_at REAL, body TEXT)"
    )
    return db


def _plain_read_after(path: Path, after: int) -> list[tuple[int, str]]:
    """As the real readers do: open read-only per read, retry while the writer is mid-commit."""
    for _ in range(500):
        try:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                rows = db.execute(
                    "SELECT seq, body FROM messages WHERE seq > ? ORDER BY seq", (after,)
                ).fetchall()
            db.close()
            return rows
        except sqlite3.Error:
            time.sleep(0.001)
    raise RuntimeError(f"baseline: could not read {path}")


class _PlainPeer:
    """One side's reader thread: waits for announces on a pipe, reads what is new, hands each
    row to ``on_row``."""

    def __init__(self, path: Path, on_row: Any) -> None:
        self.path = path
        self.on_row = on_row
        self.read_fd, self.write_fd = os.pipe()
        self.last = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def announce(self, seq: int) -> None:
        os.write(self.write_fd, f"{seq}\n".encode())

    def _run(self) -> None:
        pending = b""
        while True:
            chunk = os.read(self.read_fd, 65536)
            if not chunk:
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            target = max((int(x) for x in lines if x), default=0)
            while self.last < target:
                for seq, body in _plain_read_after(self.path, self.last):
                    self.last = seq
                    self.on_row(seq, body)

    def close(self) -> None:
        os.close(self.write_fd)
        self.thread.join(10)
        os.close(self.read_fd)


def baseline_figures() -> dict[str, Any]:
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ironclaw-bench-sqlite-") as tmp:
        inbound, outbound = Path(tmp) / "inbound.db", Path(tmp) / "outbound.db"
        in_db, out_db = _plain_writer(inbound), _plain_writer(outbound)
        state = _plain_writer(Path(tmp) / "state.db")
        seen: queue.Queue[tuple[float, int]] = queue.Queue()
        lock = threading.Lock()

        def agent_answers(seq: int, body: str) -> None:  # the "agent": read, reply, announce
            with lock:
                cur = out_db.execute(
                    "INSERT INTO messages (created_at, body) VALUES (?, ?)",
                    (time.time(), "echo: " + body),
                )
            host_side.announce(int(cur.lastrowid or 0))

        def host_ingests(seq: int, body: str) -> None:  # the "host": ingest into the record
            state.execute("INSERT INTO messages (created_at, body) VALUES (?, ?)", (0.0, body))
            seen.put((time.time(), seq))

        agent_side = _PlainPeer(inbound, agent_answers)
        host_side = _PlainPeer(outbound, host_ingests)
        try:

            def send(text: str) -> int:
                cur = in_db.execute(
                    "INSERT INTO messages (created_at, body) VALUES (?, ?)", (time.time(), text)
                )
                seq = int(cur.lastrowid or 0)
                agent_side.announce(seq)
                return seq

            for i in range(20):
                send(f"warm {i}")
            for _ in range(20):
                seen.get(timeout=30)
            samples = []
            for i in range(ROUND_TRIPS):
                started = time.perf_counter()
                seq = send(f"round trip {i}")
                while seen.get(timeout=30)[1] < seq:
                    pass
                samples.append(time.perf_counter() - started)
            report["round_trip"] = _ms(samples)

            # Inbound alone: appends with announces until the reader has read them all.
            done = threading.Event()
            count = {"n": 0}

            def count_row(seq: int, body: str) -> None:
                count["n"] += 1
                if count["n"] == BURST:
                    done.set()

            plain_in = Path(tmp) / "inbound-only.db"
            writer = _plain_writer(plain_in)
            reader = _PlainPeer(plain_in, count_row)
            started = time.perf_counter()
            for i in range(BURST):
                cur = writer.execute(
                    "INSERT INTO messages (created_at, body) VALUES (?, ?)", (0.0, f"burst {i}")
                )
                reader.announce(int(cur.lastrowid or 0))
            done.wait(120)
            report["inbound_msgs_per_s"] = round(BURST / (time.perf_counter() - started), 1)
            reader.close()

            # Outbound: the "agent" appends, the "host" reads and ingests into its record.
            base = int(out_db.execute("SELECT COALESCE(MAX(seq), 0) FROM messages").fetchone()[0])
            started = time.perf_counter()
            for i in range(BURST):
                with lock:
                    cur = out_db.execute(
                        "INSERT INTO messages (created_at, body) VALUES (?, ?)", (0.0, f"r{i}")
                    )
                host_side.announce(int(cur.lastrowid or 0))
            while True:
                if seen.get(timeout=120)[1] >= base + BURST:
                    break
            report["outbound_msgs_per_s"] = round(BURST / (time.perf_counter() - started), 1)
        finally:
            agent_side.close()
            host_side.close()
    return report


def main() -> None:
    if not Path(SOCKET).exists():
        raise SystemExit("bench: run inside a systemd with ironclawd installed (make bench)")
    previous = CONFIG.read_text() if CONFIG.exists() else None
    CONFIG.write_text((previous or "") + AGENT_CONFIG)
    subprocess.run(["systemctl", "restart", "ironclawd.service"], check=True)
    try:
        with grpc.insecure_channel(f"unix:{SOCKET}") as channel:
            ironclaw = ironclaw_figures(admin_pb2_grpc.AdminServiceStub(channel))
    finally:
        if previous is None:
            CONFIG.unlink()
        else:
            CONFIG.write_text(previous)
        subprocess.run(["systemctl", "restart", "ironclawd.service"], check=False)
    baseline = baseline_figures()
    report = {
        "round_trips": ROUND_TRIPS,
        "burst": BURST,
        "ironclaw": ironclaw,
        "plain_sqlite_baseline": baseline,
        "target_round_trip_median_ms": 20,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "bench-messages.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    rt, brt = ironclaw["round_trip"], baseline["round_trip"]
    print(
        f"round trip (send -> reply seen)  median {rt['median_ms']} ms (p90 {rt['p90_ms']}, "
        f"n={rt['n']})   plain SQLite: median {brt['median_ms']} ms"
    )
    for key, label in (
        ("inbound_msgs_per_s", "inbound msgs/s (append+announce -> agent read)"),
        ("outbound_msgs_per_s", "outbound msgs/s (agent reply -> operator sees)"),
    ):
        print(f"{label:<48} {ironclaw[key]:>9}   plain SQLite: {baseline[key]}")
    print(
        f"end to end msgs/s (pipelined burst of {BURST})        {ironclaw['end_to_end_msgs_per_s']}"
    )
    print(f"written: {out}")


if __name__ == "__main__":
    main()
