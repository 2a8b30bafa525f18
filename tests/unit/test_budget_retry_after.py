"""A per-minute rate that refuses a call says when the next is taken, and a sandbox's call ends
with that wait in the retry-after trailer, which the agent waits out (agent/metered.py): an
honest tool-heavy turn that meets its model or egress rate is answered late, not failed with its
tool work lost (found by a review). A daily budget, whose end is not soon, still says nothing.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import grpc
import pytest

from agent import metered
from ironclawd.api.boundary import refuse
from ironclawd.api.status import ANSWERED_KEY, RETRY_AFTER_KEY
from ironclawd.domain.egress import EgressLimits
from ironclawd.domain.model import Budget
from ironclawd.errors import BudgetExceeded, NotFound
from ironclawd.services.egress_budget import EgressBudget, minute_wait, take_in_minute
from tests.fakes import FakeClock
from tests.fakes.rpc import FailedCall


def test_a_model_rate_says_when_its_oldest_request_of_the_minute_ages_out() -> None:
    b = Budget(requests_per_minute=2, tokens_per_day=10**6)
    b.admit(100.0, "session s")
    b.admit(130.0, "session s")
    with pytest.raises(BudgetExceeded, match=r"the next is taken in 15\.0 s$") as info:
        b.check(145.0, "session s")
    assert info.value.retry_after == pytest.approx(15.0)
    b.check(160.0, "session s")  # the first has aged out: taken, as it said
    # Limits lowered under what the minute holds: the wait is until enough have aged out.
    b.admit(160.0, "session s")
    b.set_limits(1, 10**6)
    with pytest.raises(BudgetExceeded) as info:
        b.check(161.0, "session s")
    assert info.value.retry_after == pytest.approx(160.0 + 60 - 161.0)  # both must age out


def test_a_spent_day_names_no_wait() -> None:
    b = Budget(requests_per_minute=100, tokens_per_day=10)
    b.spend(0.0, 10)
    with pytest.raises(BudgetExceeded) as info:
        b.check(1.0, "session s")
    assert info.value.retry_after is None


def test_minute_wait_agrees_with_take_in_minute() -> None:
    times: collections.deque[float] = collections.deque()
    for t in (0.0, 10.0, 20.0):
        assert take_in_minute(times, t, 3)
    assert minute_wait(times, 30.0, 3) == 30.0
    assert not take_in_minute(times, 59.9, 3)
    assert take_in_minute(times, 60.0, 3)  # 30 s after 30.0, as it said
    assert minute_wait(collections.deque([1.0]), 2.0, 3) == 0.0


def test_an_egress_rate_says_when_the_next_request_is_taken() -> None:
    clock = FakeClock()
    budget = EgressBudget(EgressLimits(requests_per_minute=2), clock)
    budget.admit_request("s1")
    clock.advance(20)
    budget.admit_request("s1")
    clock.advance(5)
    with pytest.raises(BudgetExceeded, match=r"the next is taken in 35\.0 s$") as info:
        budget.admit_request("s1")
    assert info.value.retry_after == pytest.approx(35.0)


class _Context:
    def __init__(self) -> None:
        self.aborted: list[tuple[grpc.StatusCode, str, dict[str, str]]] = []

    async def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: Any = ()) -> None:
        self.aborted.append((code, details, dict(trailing_metadata)))
        raise grpc.aio.AbortError()


def _refused(exc: BaseException) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    context = _Context()
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(refuse(exc, "/m", context))  # type: ignore[arg-type]
    (aborted,) = context.aborted
    return aborted


def test_a_refusal_that_names_its_wait_carries_it_to_the_agent_which_waits_it_out() -> None:
    code, details, trailer = _refused(BudgetExceeded("rate reached", retry_after=2.5))
    assert (code, details) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "rate reached")
    # The abort's trailer replaces the one set when the call was let in: it says "answered" too.
    assert trailer == {ANSWERED_KEY: "1", RETRY_AFTER_KEY: "2500"}
    refusal = FailedCall(grpc.StatusCode.RESOURCE_EXHAUSTED, trailer=tuple(trailer.items()))
    assert metered.answered_by_host(refusal)
    # The agent's side: each wait at most a second, so it calls again until the rate takes it.
    assert metered.retry_after(refusal) == 1.0
    calls: list[float] = []
    slept: list[float] = []

    def call() -> str:
        calls.append(sum(slept))
        if sum(slept) < 2.5:
            raise refusal
        return "answered"

    assert metered.call_metered(call, sleep=slept.append, monotonic=lambda: sum(slept)) == (
        "answered"
    )
    assert sum(slept) >= 2.5


def test_other_refusals_keep_the_trailer_set_when_the_call_was_let_in() -> None:
    for exc in (BudgetExceeded("daily budget used up"), NotFound("no such session")):
        assert _refused(exc)[2] == {}  # none given: grpc keeps the one set before
