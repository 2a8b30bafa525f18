"""benchmarks/egress.py's table lines. The test server answers one request per connection and
closes it (``Connection: close``, tests/integration/egress_servers.py), so the pooled httpx
client connects anew each time: no line may call that baseline a kept-alive connection."""

from __future__ import annotations

from benchmarks.egress import _figures

WAYS = ("direct_keepalive", "direct_fresh", "broker", "broker_grpc", "broker_grpc_process")


def test_no_baseline_is_called_kept_alive_and_the_broker_is_set_beside_a_fresh_connection() -> None:
    small = {w: {"median_ms": 2.0 + i, "p90_ms": 3.0 + i} for i, w in enumerate(WAYS)}
    big = {w: {"median": 50.0 - i, "p10": 40.0 - i} for i, w in enumerate(WAYS)}
    figures = _figures(small, big)
    assert not any("kept-alive" in f["baseline_name"] for f in figures)
    pooled = [f for f in figures if f["baseline"] == small["direct_keepalive"]]
    assert [f["baseline_name"] for f in pooled] == [
        "a direct HTTPS GET from a pooled client (the server closes every connection)"
    ]
    fresh = "a direct HTTPS GET, new connection (what the broker does)"
    assert sum(f["baseline_name"] == fresh for f in figures) == 6
    four = [f for f in figures if f["figure"] == "egress 4 MiB, broker over gRPC"]
    assert four[0]["ratio"] == round(47.0 / 49.0, 2)  # broker_grpc against direct_fresh
