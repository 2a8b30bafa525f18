"""Calls to the host's sockets, retried while the host's call meter says "not yet".

The host meters every session's calls (``[sockets] calls_per_second``, a token bucket over all
its sockets, and a share of its event loop). A call it refuses for now ends RESOURCE_EXHAUSTED
with the trailer ``ironclaw-retry-after-ms``: how long until it would take a call again. So do
the per-minute rates of the model, egress and MCP (the minute's oldest call ages out then).
Such a refusal is the host pacing a busy agent (a backlog answered faster than the rate, a
tool-heavy turn), not an answer: the call is made again after that wait, with growing back-off,
for at most ``deadline`` seconds. Any other refusal, a daily token budget spent included, is
the caller's to report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import grpc

# The host's side: ironclawd/api/sandbox_calls.py (RETRY_AFTER_KEY, ANSWERED_KEY).
RETRY_AFTER_KEY = "ironclaw-retry-after-ms"
ANSWERED_KEY = "ironclaw-answered"
FIRST_DELAY = 0.005
MAX_DELAY = 1.0
DEADLINE = 120.0

T = TypeVar("T")


def retry_after(err: grpc.RpcError) -> float | None:
    """Seconds the host asked to wait before calling again, or None if it did not ask."""
    code = err.code() if isinstance(err, grpc.Call) else None
    if code != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    assert isinstance(err, grpc.Call)
    for key, value in err.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            try:
                millis = float(value)
            except ValueError:
                return None
            return min(max(millis, 0.0), MAX_DELAY * 1000) / 1000
    return None


def answered_by_host(err: grpc.RpcError) -> bool:
    """Whether the host answered the failed call (its trailer is there). A call without it ended
    with its connection: the host went away, or closed a connection this side kept open."""
    if not isinstance(err, grpc.Call):
        return False
    return any(key == ANSWERED_KEY for key, _ in err.trailing_metadata() or ())


def call_metered(
    call: Callable[[], T],
    *,
    deadline: float = DEADLINE,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> T:
    """``call()``, made again while the host refuses it for the call rate alone."""
    give_up_at = monotonic() + deadline
    delay = FIRST_DELAY
    while True:
        try:
            return call()
        except grpc.RpcError as err:
            wait = retry_after(err)
            if wait is None or monotonic() + max(wait, delay) > give_up_at:
                raise
            sleep(max(wait, delay))
            delay = min(delay * 2, MAX_DELAY)
