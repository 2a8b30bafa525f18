"""Egress broker latency and throughput, each beside a direct request to the same server in the
same run. Run inside a systemd (``make bench`` does, via scripts/with-systemd); needs root.

A network namespace with the test servers of tests/integration/egress_servers.py on
198.51.100.1 (a documentation range, on a veth made here; nothing leaves the machine), a name
for it in the private /etc/hosts. Compared, all over HTTPS with certificate verification:
- ``direct_keepalive``: httpx, one pooled client (what a plain client would do; the test
  server closes every connection, so this too connects anew for each request);
- ``direct_fresh``: httpx, a new connection per request (what the broker does, by design);
- ``broker``: EgressBroker.fetch in-process (rules, resolution, address checks, pinned
  connection, masking, audit);
- ``broker_grpc``: the same through EgressService on a Unix socket (the agent's path, minus
  the gVisor hop, measured here at ~1 ms p50), the client in this process and event loop;
- ``broker_grpc_process``: the same, the client a process of its own running the agent's own
  fetch code (``python -m benchmarks.egress --client SOCKET``: it reads URLs on
  standard input, fetches each, and writes back the seconds the fetch took, timed in it). In
  this process, the client's work and the server's take turns on one event loop; the agent's
  run side by side.
The ways are interleaved request by request (the order rotating each round), small GETs
(``BENCH_CALLS``, 100) and 4 MiB bodies (``BENCH_BIG_ROUNDS``, 30) alike. The baseline of the
table is ``direct_fresh``: the same work as the broker's (a new TLS connection per request);
``direct_keepalive`` is shown too. Prints the figures and writes ``results/bench-egress.json``.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import httpx

import agent
from agent import egress as agent_egress
from benchmarks.common import RESULTS, figure, rate_summary, write_result
from benchmarks.stats import summary_ms
from ironclaw.egress.v1 import egress_pb2, egress_pb2_grpc
from ironclawd.api.egress import EgressServicer
from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.egress import EgressLimits, EgressRule
from ironclawd.host.clock import SystemClock
from ironclawd.net.http import PinnedHttpClient, tls_context
from ironclawd.net.resolver import SystemResolver
from ironclawd.services.egress import EgressBroker
from tests.fakes import FakeCredentials, StaticSessions
from tests.integration.test_egress import make_certs

ROOT = Path(__file__).resolve().parents[1]
CALLS = int(os.environ.get("BENCH_CALLS", "100"))
BIG = 4 * 1024 * 1024
BIG_ROUNDS = int(os.environ.get("BENCH_BIG_ROUNDS", "30"))  # 10 spread 0.59-0.83x run to run
HOST = "api.egress.test"
SID = "bench0001"  # the session the fetches are made for (a well-formed id: the lookup checks it)


def _ms(samples: list[float]) -> dict[str, float]:
    return summary_ms(samples)


async def _interleaved(
    ways: Mapping[str, Callable[[], Awaitable[int]]], rounds: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Each way once per round, the order rotating (benchmarks/common.interleave, awaited)."""
    names = list(ways)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            t0 = time.perf_counter()
            await ways[name]()
            if r >= warmup:
                samples[name].append(time.perf_counter() - t0)
    return samples


async def _sequential(call: Callable[[], Awaitable[int]], count: int) -> None:
    for _ in range(count):
        await call()


async def measure(ca: Path, work: Path) -> dict[str, Any]:
    url = f"https://{HOST}/v1/small"
    big_url = f"https://{HOST}/v1/big/{BIG}"
    limits = EgressLimits(
        internal_cidrs=(ipaddress.ip_network("198.51.100.0/24"),), requests_per_minute=100_000,
        max_response_bytes=64 * 1024 * 1024, timeout_seconds=120,
    )  # fmt: skip
    broker = EgressBroker(
        sessions=StaticSessions(default="bench"),  # any session id is agent bench's
        agents={"bench": AgentSpec("bench", egress=(EgressRule(HOST),))},
        resolver=SystemResolver(),
        upstream=PinnedHttpClient(ca),
        credentials=FakeCredentials(),
        limits=limits,
        clock=SystemClock(),
        record=lambda decision: None,  # measured here: the broker, not the audit log
    )
    server = grpc.aio.server()
    egress_pb2_grpc.add_EgressServiceServicer_to_server(
        EgressServicer(broker, lambda: SID, 120), server
    )
    sock = work / "egress.sock"
    server.add_insecure_port(f"unix:{sock}")
    await server.start()
    channel = grpc.aio.insecure_channel(f"unix:{sock}")
    stub = egress_pb2_grpc.EgressServiceStub(channel)
    keepalive = httpx.AsyncClient(verify=tls_context(ca), trust_env=False)

    async def direct_keepalive(u: str = url) -> int:
        return len((await keepalive.get(u)).content)

    async def direct_fresh(u: str = url) -> int:
        async with httpx.AsyncClient(verify=tls_context(ca), trust_env=False) as client:
            return len((await client.get(u)).content)

    async def via_broker(u: str = url) -> int:
        got = 0
        async for event in broker.fetch(SID, "GET", u, [], b""):
            got += len(event) if isinstance(event, bytes) else 0
        return got

    async def via_grpc(u: str = url) -> int:
        got = 0
        async for event in stub.Fetch(egress_pb2.FetchRequest(url=u)):
            got += len(event.body_chunk)
        return got

    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.egress", "--client", str(sock),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT,
        env={**os.environ, **agent.GRPC_ENVIRONMENT},  # grpc's client as the agent runs it
    )  # fmt: skip
    if worker.stdin is None or worker.stdout is None:
        raise SystemExit("bench: the egress client process has no pipes")
    client_in, client_out = worker.stdin, worker.stdout
    took: dict[str, list[float]] = {}  # the seconds each fetch took, timed in the client

    async def via_grpc_process(u: str = url) -> int:
        client_in.write(u.encode() + b"\n")
        await client_in.drain()
        seconds, got = (await client_out.readline()).split()
        took.setdefault(u, []).append(float(seconds))
        return int(got)

    ways: dict[str, Callable[[str], Awaitable[int]]] = {
        "direct_keepalive": direct_keepalive,
        "direct_fresh": direct_fresh,
        "broker": via_broker,
        "broker_grpc": via_grpc,
        "broker_grpc_process": via_grpc_process,
    }
    for name, way in ways.items():
        assert await way(big_url) == BIG, name
    small = await _interleaved({n: functools.partial(w, url) for n, w in ways.items()}, CALLS)
    big = await _interleaved(
        {n: functools.partial(w, big_url) for n, w in ways.items()}, BIG_ROUNDS
    )
    # The client process's own timings, not this process's (they leave out the pipe). Left
    # out, as above: the warm-up round of each, and for the 4 MiB body the check before it.
    small["broker_grpc_process"] = took[url][1:]
    big["broker_grpc_process"] = took[big_url][2:]
    client_in.close()
    await worker.wait()
    results: dict[str, Any] = {
        "latency_small": {n: _ms(v) for n, v in small.items()},
        "throughput_4mib": {
            n: {**rate_summary([BIG / x / 2**20 for x in v]), "unit": "MiB/s"}
            for n, v in big.items()
        },
    }
    concurrent = {}
    for name in ("direct_fresh", "broker", "broker_grpc"):  # not the one-process client
        t0 = time.perf_counter()
        # Four workers (the per-session connection cap), 25 requests each.
        call = functools.partial(ways[name], url)
        await asyncio.gather(*(_sequential(call, 25) for _ in range(4)))
        concurrent[name] = round(100 / (time.perf_counter() - t0), 1)
    results["requests_per_second_4x25_concurrent"] = concurrent
    await keepalive.aclose()
    await channel.close(None)
    await server.stop(1)
    return results


def main() -> int:
    tag = secrets.token_hex(3)
    ns, veth = f"icbench-eg-{tag}", f"icbeg{tag}"
    work = Path(tempfile.mkdtemp(prefix="bench-egress-", dir=RESULTS))
    make_certs(work)
    script = ROOT / "tests/integration/egress_servers.py"

    def run(*argv: str) -> None:
        subprocess.run(argv, check=True)

    server = None
    hosts = Path("/etc/hosts").read_text()
    try:
        run("ip", "netns", "add", ns)
        run("ip", "link", "add", f"{veth}h", "type", "veth", "peer", "name", f"{veth}n",
            "netns", ns)  # fmt: skip
        run("ip", "addr", "add", "198.51.100.2/24", "dev", f"{veth}h")
        run("ip", "link", "set", f"{veth}h", "up")
        run("ip", "-n", ns, "addr", "add", "198.51.100.1/24", "dev", f"{veth}n")
        run("ip", "-n", ns, "link", "set", f"{veth}n", "up")
        log = work / "ns.jsonl"
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, str(script), "--ns", "--log", str(log),
             "--cert", str(work / "server.pem"), "--key", str(work / "server.key")],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        while not (log.exists() and "ready" in log.read_text()):
            time.sleep(0.05)
        log.write_text("")  # the servers log every request: keep the file small
        Path("/etc/hosts").write_text(hosts + f"\n198.51.100.1 {HOST}\n")
        results = asyncio.run(measure(work / "ca.pem", work))
    finally:
        Path("/etc/hosts").write_text(hosts)
        if server is not None:
            server.terminate()
            server.wait()
        subprocess.run(["ip", "link", "del", f"{veth}h"], check=False)
        subprocess.run(["ip", "netns", "del", ns], check=False)
        subprocess.run(["rm", "-rf", str(work)], check=False)
    figures = _figures(results["latency_small"], results["throughput_4mib"])
    write_result("egress", figures, calls=CALLS, big_rounds=BIG_ROUNDS, **results)
    return 0


def _figures(small: dict[str, Any], big: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's lines from the summaries of each way (``latency_small``, ``throughput_4mib``).
    The test server answers every request with ``Connection: close``
    (tests/integration/egress_servers.py), so the pooled client's way opens a new connection
    each time too: it is no kept-alive baseline, and is not called one."""
    fresh = "a direct HTTPS GET, new connection (what the broker does)"
    pooled = "a direct HTTPS GET from a pooled client (the server closes every connection)"
    return [
        figure("egress small GET, broker over gRPC", small["broker_grpc"],
               fresh, small["direct_fresh"]),
        figure("egress small GET, broker over gRPC", small["broker_grpc"],
               pooled, small["direct_keepalive"]),
        figure("egress small GET, broker in-process", small["broker"], fresh,
               small["direct_fresh"]),
        figure("egress small GET, broker over gRPC, client in a process of its own (as the agent)",
               small["broker_grpc_process"], fresh, small["direct_fresh"]),
        figure("egress 4 MiB, broker over gRPC", big["broker_grpc"], fresh, big["direct_fresh"],
               unit="MiB/s"),
        figure("egress 4 MiB, broker over gRPC, client in a process of its own (as the agent)",
               big["broker_grpc_process"], fresh, big["direct_fresh"], unit="MiB/s"),
        figure("egress 4 MiB, broker in-process", big["broker"], fresh, big["direct_fresh"],
               unit="MiB/s"),
    ]  # fmt: skip


def client(socket_path: str) -> int:
    """The agent's side of the broker, with the agent's own code (agent/egress.py: its kept
    synchronous channel and its read of the stream): a fetch per URL read on standard input,
    "<seconds> <bytes>" written back for each."""
    for line in sys.stdin:
        t0 = time.perf_counter()
        _head, chunks, _end = agent_egress._exchange(
            egress_pb2.FetchRequest(url=line.strip()), socket_path
        )
        seconds = time.perf_counter() - t0
        sys.stdout.write(f"{seconds:.9f} {sum(len(c) for c in chunks)}\n")
        sys.stdout.flush()
    agent_egress.close_channels()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--client"]:
        sys.exit(client(sys.argv[2]))
    sys.exit(main())
