"""Channels (issue 15): inbound-to-reply latency over a signed webhook and over Matrix, beside the
admin API and ``ironctl send`` to an equivalent session, interleaved in one run.

Run inside a systemd with ironclawd installed (``make bench``, or ``make bench BENCH=channels``).
One agent ``bench-chan`` (mock model, no tools, rate limits out of the way) is wired, by approved
``wiring`` and ``permissions`` changes, to a webhook endpoint and to a Matrix room; every way
ends at a warm session of that agent (per sender: one for the endpoint, one for alice, one
created over the admin API), and the mock model answers ``mock: <text>``. Measured, the ways
interleaved round by round (who goes first rotates) so that drift on a shared machine hits all
alike:

- ``webhook``: a signed ``POST /hooks/bench`` to the daemon's listener on 127.0.0.1 until the
  reply's signed POST reaches a receiver in a network namespace made here (198.18.x.1, a range
  ``[egress] internal_cidrs`` opens; the daemon delivers only under the broker's address rules),
  stamped by the receiver as it read the body (CLOCK_MONOTONIC, the same clock as here);
- ``matrix``: alice's ``room_send`` in the wired room on a real Synapse (tests/harness/synapse.py,
  loopback) until her own long-poll sync returns the bot's reply;
- ``admin_api``: SendMessage to the third session until its reply arrives on an open
  WatchReplies stream (what ``ironctl send`` does, minus its process start): the baseline;
- ``ironctl_send``: ``ironctl send SID TEXT`` as a process, start to exit (the CLI as a person
  runs it).

Two legs are timed inside the channel rounds: ``webhook_post_answered`` (the POST until its
``200 queued``, i.e. the inbox took it) and ``matrix_room_send`` (alice's send until Synapse
answered with the event id).

Prints a markdown table (median, p90, added over the baseline's median) with the machine's facts
and writes ``results/bench-channels.json``; no assertion on any timing.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import nio

from benchmarks.common import write_doc
from benchmarks.mcp import Sandbox
from benchmarks.stats import summary_ms
from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from ironclawd.formats.webhook_sig import HEADER, sign
from tests.harness.agents import unlimited_agent
from tests.harness.synapse import Account, Homeserver, synapse_homeserver

ROOT = Path(__file__).resolve().parents[1]
SOCKET = "/run/ironclaw/admin.sock"
CONFIG = Path("/etc/ironclaw/ironclawd.toml")
CREDENTIALS = Path("/etc/ironclaw/credentials")
ROUNDS = int(os.environ.get("BENCH_CHAN_ROUNDS", "30"))
WARMUP = 3
WAIT = 120.0  # seconds for any one reply (a session's cold start is in the warm-up)
AGENT = "bench-chan"
ENDPOINT, HOOK_CRED, MATRIX_CRED = "bench", "bench-hook", "bench-matrix"
SECRET = secrets.token_hex(32)
NETNS, VETH = "ironclaw-bench-rx", "icbench"
OCTET = 203  # 198.18.203.0/24: the benchmarking range, on a veth made here
RX_ADDR, RX_PORT = f"198.18.{OCTET}.1", 8080
Timed = Callable[[str], Awaitable[float]]
WAYS = ("webhook", "matrix", "admin_api", "ironctl_send")

# The reply receiver, run in NETNS: one JSON line per POST, stamped when its body was read.
RECEIVER = r"""
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
lock = threading.Lock()
class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        at = time.monotonic()
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
        with lock:
            sys.stdout.write(json.dumps({"at": at, "body": body.decode("utf-8", "replace")}) + "\n")
            sys.stdout.flush()
    def log_message(self, *args): pass
server = ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Handler)
print("ready", flush=True)
server.serve_forever()
"""


def _run(script: str) -> None:
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench-channels: {script.strip()[:200]}: {proc.stderr[-1000:]}")


def _ctl(*args: str) -> dict[str, Any]:
    proc = subprocess.run(["ironctl", "--json", *args], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"bench-channels: ironctl {' '.join(args)}: {proc.stdout}{proc.stderr}")
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def _approved(kind: str, payload: dict[str, Any]) -> None:
    change = _ctl("change", "submit", "--kind", kind, "--agent", AGENT, "--payload",
                  json.dumps(payload), "--reason", "benchmark")  # fmt: skip
    done = _ctl("change", "approve", change["id"], "--yes")
    if done.get("state") != "applied":
        raise SystemExit(f"bench-channels: the {kind} change ended {done}")


def _config(port: int, hs: Homeserver, bot: str) -> str:
    return (
        unlimited_agent(AGENT)
        + f"""
[egress]
internal_cidrs = ["198.18.{OCTET}.0/24"]

[[channels]]
name = "hooks"
type = "webhook"
listen = "127.0.0.1:{port}"
sender_messages_per_minute = 100000
channel_messages_per_minute = 100000
endpoints = [{{name = "{ENDPOINT}", secret_credential = "{HOOK_CRED}"}}]

[[channels]]
name = "chat"
type = "matrix"
homeserver = "{hs.url}"
user_id = "{bot}"
token_credential = "{MATRIX_CRED}"
sender_messages_per_minute = 100000
channel_messages_per_minute = 100000
"""
    )


class Receiver:
    """The reply receiver's output, each reply's receipt time by the event it answers."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc, self.waiting = proc, dict[str, asyncio.Future[float]]()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            entry = json.loads(line)
            body = json.loads(entry["body"])
            future = self.waiting.pop(body.get("in_reply_to_event", ""), None)
            if future is not None and not future.done():
                future.set_result(float(entry["at"]))


class Alice:
    """Alice's client and her long-poll sync: each bot message's arrival time by its body."""

    def __init__(self, client: nio.AsyncClient, room: str, bot: str) -> None:
        self.client, self.room, self.bot = client, room, bot
        self.waiting: dict[str, asyncio.Future[float]] = {}
        self.task: asyncio.Task[None] | None = None

    async def follow(self) -> None:
        first = await self.client.sync(timeout=0)
        if not isinstance(first, nio.SyncResponse):
            raise SystemExit(f"bench-channels: alice's first sync: {first}")
        since = first.next_batch
        while True:
            got = await self.client.sync(timeout=25000, since=since)
            seen = time.monotonic()
            if not isinstance(got, nio.SyncResponse):
                await asyncio.sleep(0.1)
                continue
            since = got.next_batch
            joined = got.rooms.join.get(self.room)
            for event in joined.timeline.events if joined else []:
                body = event.source.get("content", {}).get("body", "")
                future = self.waiting.pop(body, None) if event.sender == self.bot else None
                if future is not None and not future.done():
                    future.set_result(seen)


async def _bot_joined(alice: nio.AsyncClient, room: str, bot: str) -> None:
    for _ in range(600):
        got = await alice.joined_members(room)
        if isinstance(got, nio.JoinedMembersResponse) and bot in {m.user_id for m in got.members}:
            return
        await asyncio.sleep(0.1)
    raise SystemExit(f"bench-channels: the bot never joined {room}; see journalctl -u ironclawd")


async def measure(port: int, alice: Alice, sandbox: Sandbox) -> dict[str, list[float]]:
    loop = asyncio.get_running_loop()
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", NETNS, sys.executable, "-c", RECEIVER, RX_ADDR, str(RX_PORT),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    if (await proc.stdout.readline()).strip() != b"ready":
        raise SystemExit("bench-channels: the reply receiver did not start")
    receiver = Receiver(proc)
    alice.task = asyncio.create_task(alice.follow())
    url = f"http://127.0.0.1:{port}/hooks/{ENDPOINT}"
    # The first leg of each channel: until the sender holds the acknowledgement.
    legs: dict[str, list[float]] = {"webhook_post_answered": [], "matrix_room_send": []}
    async with aiohttp.ClientSession() as http:

        async def webhook(text: str) -> float:
            event_id = uuid.uuid4().hex
            body = json.dumps({"event_id": event_id, "text": text}).encode()
            seen: asyncio.Future[float] = loop.create_future()
            receiver.waiting[event_id] = seen
            t0 = time.monotonic()
            headers = {"Content-Type": "application/json",
                       HEADER: sign(SECRET.encode(), int(time.time()), body)}  # fmt: skip
            async with http.post(url, data=body, headers=headers) as answer:
                if answer.status != 200 or (await answer.json())["status"] != "queued":
                    raise SystemExit(
                        f"bench-channels: webhook {answer.status} {await answer.text()}"
                    )
            legs["webhook_post_answered"].append(time.monotonic() - t0)
            return await asyncio.wait_for(seen, WAIT) - t0

        async def matrix(text: str) -> float:
            seen: asyncio.Future[float] = loop.create_future()
            alice.waiting["mock: " + text] = seen
            t0 = time.monotonic()
            sent = await alice.client.room_send(
                alice.room, "m.room.message", {"msgtype": "m.text", "body": text}
            )
            if not isinstance(sent, nio.RoomSendResponse):
                raise SystemExit(f"bench-channels: alice's send: {sent}")
            legs["matrix_room_send"].append(time.monotonic() - t0)
            return await asyncio.wait_for(seen, WAIT) - t0

        async def admin_api(text: str) -> float:
            return await asyncio.to_thread(sandbox.round_trip, text, "mock: " + text)

        async def ironctl_send(text: str) -> float:
            t0 = time.monotonic()
            ctl = await asyncio.create_subprocess_exec(
                "ironctl", "send", sandbox.sid, text, stdout=asyncio.subprocess.PIPE
            )
            out, _ = await ctl.communicate()
            took = time.monotonic() - t0
            if ctl.returncode != 0 or out.decode().strip() != "mock: " + text:
                raise SystemExit(f"bench-channels: ironctl send answered {out[:300]!r}")
            return took

        ways: dict[str, Timed] = {"webhook": webhook, "matrix": matrix, "admin_api": admin_api,
                                  "ironctl_send": ironctl_send}  # fmt: skip
        samples: dict[str, list[float]] = {name: [] for name in ways}
        order = list(ways)
        for i in range(WARMUP + ROUNDS):
            for name in order[i % len(order) :] + order[: i % len(order)]:
                took = await ways[name](f"{name} round {i} {uuid.uuid4().hex[:8]}")
                if i >= WARMUP:
                    samples[name].append(took)
    alice.task.cancel()
    proc.terminate()
    await proc.wait()
    receiver.task.cancel()
    return samples | {name: taken[WARMUP:] for name, taken in legs.items()}


def _configure(port: int, hs: Homeserver, bot: Account) -> str | None:
    """The bot's token as a credential and the config appended; the previous config."""
    (CREDENTIALS / MATRIX_CRED).write_text(bot.token)
    previous = CONFIG.read_text() if CONFIG.exists() else None
    if previous and "[egress]" in previous:
        raise SystemExit(f"bench-channels: {CONFIG} has an [egress] table of its own")
    CONFIG.write_text((previous or "") + _config(port, hs, bot.user_id))
    return previous


def _restore(previous: str | None) -> None:
    if previous is None:
        CONFIG.unlink()
    else:
        CONFIG.write_text(previous)
    subprocess.run(["systemctl", "restart", "ironclawd.service"], check=False)


def _wire(room: str, alice: str) -> None:
    """The routes and permissions, approved as an operator would."""
    _run("systemctl restart ironclawd.service")
    _approved("wiring", {"routes": [
        {"channel": "hooks", "where": ENDPOINT, "reply_url": f"http://{RX_ADDR}:{RX_PORT}/replies"},
        {"channel": "chat", "where": room},
    ]})  # fmt: skip
    _approved("permissions", {"allow": ["hooks:" + ENDPOINT, "chat:" + alice]})
    # The channel joins, as it starts, the wired rooms its bot was invited to.
    _run("systemctl restart ironclawd.service")


async def in_daemon(hs: Homeserver) -> tuple[dict[str, list[float]], str]:
    """Wire the agent to both channels the operator's way, then the interleaved rounds."""
    alice_account, bot = hs.register("alice"), hs.login(hs.register("agentbot"), "IRONCLAW")
    client = nio.AsyncClient(hs.url, alice_account.user_id)
    client.restore_login(alice_account.user_id, alice_account.device_id, alice_account.token)
    try:
        # Room version 11: Synapse's default (12) makes ids without ":server", which a wiring
        # route does not take yet (domain/channels.py ROOM_ID_RE).
        created = await client.room_create(invite=[bot.user_id], room_version="11")
        if not isinstance(created, nio.RoomCreateResponse):
            raise SystemExit(f"bench-channels: room_create: {created}")
        room = created.room_id
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        previous = await asyncio.to_thread(_configure, port, hs, bot)
        try:
            await asyncio.to_thread(_wire, room, alice_account.user_id)
            await _bot_joined(client, room, bot.user_id)
            with grpc.insecure_channel(f"unix:{SOCKET}") as channel:
                stub = admin_pb2_grpc.AdminServiceStub(channel)
                made = stub.CreateSession(admin_pb2.CreateSessionRequest(agent=AGENT), timeout=120)
                sandbox = Sandbox(stub, made.session.sid, "bench-channels")
                try:
                    samples = await measure(port, Alice(client, room, bot.user_id), sandbox)
                finally:
                    sandbox.replies.close()
                    request = admin_pb2.RemoveSessionRequest(sid=sandbox.sid, force=True)
                    stub.RemoveSession(request, timeout=60)
            return samples, made.session.platform
        finally:
            await asyncio.to_thread(_restore, previous)
    finally:
        await client.close()


def _machine(sandbox_platform: str) -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.machine())  # fmt: skip
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    runsc = subprocess.run(["runsc", "--version"], capture_output=True, text=True, check=False)
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_kib / 2**20, 1),
            "kernel": platform.release(), "runsc": (runsc.stdout.splitlines() or ["?"])[0],
            "platform": sandbox_platform, "load_avg_1m_after": os.getloadavg()[0]}  # fmt: skip


def main() -> int:
    if not Path(SOCKET).exists():
        raise SystemExit("bench: run inside a systemd with ironclawd installed (make bench)")
    CREDENTIALS.mkdir(parents=True, exist_ok=True, mode=0o700)
    old_umask = os.umask(0o077)
    (CREDENTIALS / HOOK_CRED).write_text(SECRET)
    _run(f"""
        ip netns add {NETNS}
        ip link add {VETH}h type veth peer name {VETH}n netns {NETNS}
        ip addr add 198.18.{OCTET}.2/24 dev {VETH}h && ip link set {VETH}h up
        ip -n {NETNS} addr add {RX_ADDR}/24 dev {VETH}n
        ip -n {NETNS} link set {VETH}n up && ip -n {NETNS} link set lo up
    """)
    try:
        with tempfile.TemporaryDirectory(prefix="ironclaw-bench-synapse-") as tmp:
            os.chmod(tmp, 0o700)
            with synapse_homeserver(Path(tmp)) as hs:
                samples, sandbox_platform = asyncio.run(in_daemon(hs))
    finally:
        os.umask(old_umask)
        for name in (HOOK_CRED, MATRIX_CRED):
            (CREDENTIALS / name).unlink(missing_ok=True)
        _run(f"ip link del {VETH}h 2>/dev/null; ip netns del {NETNS} 2>/dev/null; true")
    figures = {name: summary_ms(s, 2) for name, s in samples.items()}
    base = figures["admin_api"]["median_ms"]  # the same session work without a channel
    added = {name: round(figures[name]["median_ms"] - base, 2) for name in WAYS}
    m = _machine(sandbox_platform)
    report = {"rounds": ROUNDS, "warmup": WARMUP, "machine": m,
              "figures": figures, "added_median_ms_over_admin_api": added}  # fmt: skip
    out = write_doc("channels", report)
    print(f"inbound-to-reply latency, {ROUNDS} rounds each, interleaved; {m['cpu']} "
          f"({m['cores']} cores, {m['memory_gib']} GiB), kernel {m['kernel']}, {m['runsc']}, "
          f"platform {m['platform']}, load {m['load_avg_1m_after']:.2f}\n")  # fmt: skip
    print("| way | median ms | p90 ms | min ms | added over admin_api (median ms) |")
    print("|---|---:|---:|---:|---:|")
    for name, f in figures.items():
        more = added.get(name, "(leg)")
        print(f"| {name} | {f['median_ms']} | {f['p90_ms']} | {f['min_ms']} | {more} |")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
