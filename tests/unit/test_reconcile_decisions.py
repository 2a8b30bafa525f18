"""The reconciliation decision table (ironclawd/domain/reconcile.py): every persisted state,
against every combination of what the host can show, has a defined action."""

from __future__ import annotations

import itertools

import pytest

from ironclawd.domain.reconcile import Action, HostFacts, decide
from ironclawd.domain.session import LIVE, TRANSITIONS, State

UNIT_STATES = ("", "active", "activating", "deactivating", "inactive", "failed")
ALL_FACTS = [
    HostFacts(unit_state=u, netns=n, runsc=r)
    for u, n, r in itertools.product(UNIT_STATES, (False, True), (False, True))
]


@pytest.mark.parametrize("facts", ALL_FACTS, ids=lambda f: f.describe())
@pytest.mark.parametrize("state", list(State), ids=lambda s: s.value)
def test_every_state_and_host_has_a_settling_action(state: State, facts: HostFacts) -> None:
    action, reason = decide(state, facts)
    if action is Action.FAIL:
        assert reason.startswith(f"daemon restarted while the session was {state.value} (")
        assert facts.describe() in reason
        assert State.FAILED in TRANSITIONS[state]
    else:
        assert reason == ""
    if state not in LIVE:
        assert action is Action.KEEP  # settled already; leftovers go as orphans


@pytest.mark.parametrize(
    ("state", "facts", "expected"),
    [
        (State.RUNNING, HostFacts("active", True, True), Action.ADOPT),
        (State.RUNNING, HostFacts("active", False, False), Action.ADOPT),  # hello decides
        (State.RUNNING, HostFacts("failed", True, True), Action.FAIL),
        (State.RUNNING, HostFacts("", False, False), Action.FAIL),
        (State.RUNNING, HostFacts("deactivating", True, True), Action.FAIL),
        # The crash of issue 11: a stop was under way; it is finished, never a second "stopping".
        (State.STOPPING, HostFacts("active", True, True), Action.FINISH_STOP),
        (State.STOPPING, HostFacts("deactivating", True, False), Action.FINISH_STOP),
        (State.STOPPING, HostFacts("", False, False), Action.FINISH_STOP),
        (State.STARTING, HostFacts("active", True, True), Action.FAIL),
        (State.STARTING, HostFacts("", True, False), Action.FAIL),
        (State.CREATING, HostFacts("", False, False), Action.FAIL),
        (State.STOPPED, HostFacts("active", True, True), Action.KEEP),
        (State.FAILED, HostFacts("failed", False, False), Action.KEEP),
    ],
)
def test_decision_table(state: State, facts: HostFacts, expected: Action) -> None:
    assert decide(state, facts)[0] is expected


def test_reason_names_what_the_host_showed() -> None:
    _, reason = decide(State.RUNNING, HostFacts("failed", netns=True, runsc=False))
    assert reason == (
        "daemon restarted while the session was running "
        "(unit failed, a netns name, no runsc container)"
    )
