"""The model budgets' pure rules (ironclawd/domain/model.py): calls in flight hold a reservation
that the daily check counts, what a call is charged from how it ended, and the input estimate
the reservation and some charges start from."""

from __future__ import annotations

import pytest

from ironclawd.domain.model import (
    Budget,
    Completion,
    Message,
    ToolCall,
    ToolDef,
    estimated_input_tokens,
    tokens_to_charge,
)
from ironclawd.errors import BudgetExceeded

# -- reservations ------------------------------------------------------------------------------


def test_calls_in_flight_count_against_the_day_until_they_end() -> None:
    b = Budget(requests_per_minute=1000, tokens_per_day=100)
    b.admit(0.0, "session s")
    b.reserve(60)  # the first call, running
    b.admit(1.0, "session s")  # 60 held: still under
    b.reserve(60)
    with pytest.raises(
        BudgetExceeded,
        match=r"session s: daily budget of 100 tokens used up \(0; 120 reserved by calls in flight",
    ):
        b.check(2.0, "session s")
    b.release(60)
    b.spend(3.0, 10)  # the first call ended: 10 spent, 60 still held by the second
    b.check(4.0, "session s")
    b.release(60)
    b.spend(5.0, 95)
    with pytest.raises(BudgetExceeded, match=r"used up \(105\)$"):
        b.check(6.0, "session s")


def test_a_lone_call_is_admitted_while_the_day_is_under_budget_whatever_it_reserves() -> None:
    b = Budget(requests_per_minute=1000, tokens_per_day=100)
    b.spend(0.0, 99)
    b.check(1.0, "agent a")  # its own reservation (say 1024) is not held against it
    b.reserve(1024)
    with pytest.raises(BudgetExceeded):
        b.check(2.0, "agent a")


def test_new_limits_keep_what_was_counted() -> None:
    b = Budget(requests_per_minute=1000, tokens_per_day=10**6)
    for t in range(3):
        b.admit(float(t), "s")
    b.spend(3.0, 500)
    b.set_limits(3, 400)
    assert (b.requests_per_minute, b.tokens_per_day) == (3, 400)
    with pytest.raises(BudgetExceeded, match="rate limit of 3"):
        b.check(4.0, "s")
    b.set_limits(10, 400)
    with pytest.raises(BudgetExceeded, match=r"daily budget of 400 tokens used up \(500\)"):
        b.check(4.0, "s")


# -- what a call is charged --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ending", "reported", "charged"),
    [
        ("ok", (300, 40), 340),  # what the provider reported
        ("ok", None, 100 + 3),  # none reported: the estimate and 10 characters out, / 4 up
        ("upstream-error", (300, 0), 300),
        ("upstream-error", None, 0),  # refused before anything was billed
        ("abandoned", None, 100 + 1000),  # the estimate and the whole of max_tokens
        ("abandoned", (300, 0), 300 + 1000),  # the reported input in place of the estimate
        ("abandoned", (0, 0), 100 + 1000),
        ("abandoned", (300, 5000), 5300),  # more was reported than the floor
    ],
)
def test_tokens_to_charge(ending: str, reported: tuple[int, int] | None, charged: int) -> None:
    got = tokens_to_charge(
        ending,  # type: ignore[arg-type]
        reported,
        input_estimate=100,
        max_tokens=1000,
        streamed_chars=10,
    )
    assert got == charged


def test_the_input_estimate_is_a_quarter_of_every_character_sent_rounded_up() -> None:
    call = ToolCall("id1", "read_file", '{"path": "a"}')
    tool = ToolDef("t", "d" * 10, "{}")
    completion = Completion(
        "S" * 7,
        (
            Message("user", "u" * 5),
            Message("assistant", "", (call,)),
            Message("tool", "r", (), "id1"),
        ),
        (tool,),
        "model",
        50,
    )
    chars = 7 + 5 + (3 + 9 + 13) + (1 + 3) + (1 + 10 + 2)
    assert estimated_input_tokens(completion) == -(-chars // 4)
    assert estimated_input_tokens(Completion("", (Message("user", "x"),), (), "m", 1)) == 1
