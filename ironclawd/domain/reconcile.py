"""What reconciliation does with one persisted session, given what the host shows: the decision
table of docs/architecture.md §3 Lifecycle as a pure function (every persisted state has a row, so
no state a crash can leave behind stops the daemon from starting)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ironclawd.domain.session import State


class Action(enum.Enum):
    ADOPT = "adopt"  # its sandbox runs: wait for the agent to reconnect
    FINISH_STOP = "finish-stop"  # a stop was under way: finish it, the session ends stopped
    FAIL = "fail"  # tear down whatever exists, the session ends failed with the reason
    KEEP = "keep"  # already settled; leftovers are removed as orphans


@dataclass(frozen=True)
class HostFacts:
    """What the host shows for one session when the daemon starts."""

    unit_state: str = ""  # the sandbox unit's ActiveState, "" when it is not loaded
    # /run/netns/ironclaw-<sid> exists. A running session has none (its sandbox unit's main
    # process holds the namespace), so this says only whether a name is left over.
    netns: bool = False
    runsc: bool = False  # runsc knows its container

    @property
    def unit_active(self) -> bool:
        return self.unit_state == "active"

    def describe(self) -> str:
        unit = f"unit {self.unit_state}" if self.unit_state else "no unit"
        return (
            f"{unit}, {'a' if self.netns else 'no'} netns name, "
            f"{'a' if self.runsc else 'no'} runsc container"
        )


def decide(state: State, host: HostFacts) -> tuple[Action, str]:
    """The action for a session persisted in ``state``, and the reason it would fail with."""
    reason = f"daemon restarted while the session was {state.value} ({host.describe()})"
    if state is State.RUNNING:
        return (Action.ADOPT, "") if host.unit_active else (Action.FAIL, reason)
    if state is State.STOPPING:
        return Action.FINISH_STOP, ""
    if state in (State.CREATING, State.STARTING):
        # The client never got an answer and the agent never said hello to this daemon: what
        # was made of it cannot be trusted to be complete.
        return Action.FAIL, reason
    return Action.KEEP, ""
