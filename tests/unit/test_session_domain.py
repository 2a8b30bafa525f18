from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ironclawd.domain.session import (
    TRANSITIONS,
    Session,
    State,
    check_sid,
    new_sid,
    sid_from_netns,
    sid_from_unit,
    transition,
    unit_name,
)
from ironclawd.errors import Conflict, InvalidArgument


def _session(state: State) -> Session:
    return Session("abcd1234", "demo", state, 1.0, 1.0, 1.0)


def test_happy_path() -> None:
    s = _session(State.CREATING)
    for to in (State.STARTING, State.RUNNING, State.STOPPING, State.STOPPED, State.STARTING):
        s = transition(s, to, now=2.0)
        assert s.state is to
        assert s.updated_at == 2.0


@given(st.sampled_from(list(State)), st.sampled_from(list(State)))
def test_only_listed_transitions_are_allowed(frm: State, to: State) -> None:
    if to in TRANSITIONS[frm]:
        assert transition(_session(frm), to, now=3.0).state is to
    else:
        with pytest.raises(Conflict, match=f"cannot go from {frm.value} to {to.value}"):
            transition(_session(frm), to, now=3.0)


def test_failure_reason_is_kept_and_cleared() -> None:
    failed = transition(_session(State.STARTING), State.FAILED, 2.0, "boom")
    assert failed.error == "boom"
    assert transition(failed, State.STARTING, 3.0).error == ""


def test_the_restart_mark_is_kept_only_by_a_move_that_says_so() -> None:
    """Each record a restart writes is marked; any other move (the start's RUNNING, a failure)
    clears the mark, so a session that runs again is never left marked."""
    stopping = transition(_session(State.RUNNING), State.STOPPING, 2.0, restarting=True)
    stopped = transition(stopping, State.STOPPED, 3.0, restarting=True)
    starting = transition(stopped, State.STARTING, 4.0, restarting=True)
    assert (stopping.restarting, stopped.restarting, starting.restarting) == (True, True, True)
    assert (stopped.error, starting.error) == ("", "")
    assert not transition(starting, State.RUNNING, 5.0).restarting
    assert not transition(starting, State.FAILED, 5.0, "boom").restarting


def test_new_sids_are_valid_and_distinct() -> None:
    sids = {new_sid() for _ in range(500)}
    assert len(sids) == 500
    assert all(check_sid(s) == s for s in sids)


@pytest.mark.parametrize("bad", ["", "short", "UPPERCASE1", "has-dash1", "a" * 33, "abc/../x1"])
def test_bad_sids_name_the_field(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="session id: expected 8-32 characters"):
        check_sid(bad)


def test_names_round_trip() -> None:
    assert sid_from_unit(unit_name("abcd1234")) == "abcd1234"
    assert sid_from_netns("ironclaw-abcd1234") == "abcd1234"
    assert sid_from_unit("ironclaw-sbx-../x.service") is None
    assert sid_from_netns("ironclaw-doctor-ab12") is None
