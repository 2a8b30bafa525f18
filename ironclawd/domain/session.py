"""Sessions: the explicit state machine (docs/architecture.md §3 Lifecycle). Pure values."""

from __future__ import annotations

import enum
import re
import secrets
from dataclasses import dataclass, replace

from ironclawd import lazy_re
from ironclawd.errors import Conflict, InvalidArgument

SID_RE = lazy_re.compile(r"[a-z0-9]{8,32}")
_SID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


class State(enum.Enum):
    CREATING = "creating"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


# Allowed moves. STOPPED and FAILED sessions may start again; anything may fail.
TRANSITIONS: dict[State, frozenset[State]] = {
    State.CREATING: frozenset({State.STARTING, State.FAILED, State.STOPPED}),
    State.STARTING: frozenset({State.RUNNING, State.STOPPING, State.FAILED}),
    State.RUNNING: frozenset({State.STOPPING, State.FAILED}),
    State.STOPPING: frozenset({State.STOPPED, State.FAILED}),
    State.STOPPED: frozenset({State.STARTING}),
    State.FAILED: frozenset({State.STARTING, State.STOPPING, State.STOPPED}),
}

# States in which host resources (unit, netns, bundle, runsc state) may exist.
LIVE = frozenset({State.CREATING, State.STARTING, State.RUNNING, State.STOPPING})


@dataclass(frozen=True)
class Session:
    sid: str
    agent: str
    state: State
    created_at: float
    updated_at: float
    last_active_at: float
    error: str = ""
    platform: str = ""
    # An approved change's restart of its agent's sessions is under way for this one: set on
    # each record the restart writes until the session runs again (stopping, stopped,
    # starting). A stop or a death of the daemon that cuts the restart leaves it stopped so,
    # and the next start starts it again; the operator's stop clears it. A field of its own,
    # not a text in ``error``: it is no error, and a text could not be reworded.
    restarting: bool = False

    @property
    def unit(self) -> str:
        return unit_name(self.sid)

    @property
    def netns(self) -> str:
        return netns_name(self.sid)

    @property
    def container_id(self) -> str:
        return container_id(self.sid)


def new_sid() -> str:
    """A fresh session id: 12 characters of [a-z0-9] (62 bits)."""
    return "".join(secrets.choice(_SID_ALPHABET) for _ in range(12))


def check_sid(sid: str) -> str:
    if not SID_RE.fullmatch(sid):
        raise InvalidArgument(f"session id: expected 8-32 characters of [a-z0-9], got {sid!r}")
    return sid


def unit_name(sid: str) -> str:
    return f"ironclaw-sbx-{sid}.service"


def netns_name(sid: str) -> str:
    return f"ironclaw-{sid}"


def container_id(sid: str) -> str:
    return f"ironclaw-{sid}"


def sid_from_unit(unit: str) -> str | None:
    match = re.fullmatch(r"ironclaw-sbx-([a-z0-9]{8,32})\.service", unit)
    return match.group(1) if match else None


def sid_from_netns(name: str) -> str | None:
    match = re.fullmatch(r"ironclaw-([a-z0-9]{8,32})", name)
    return match.group(1) if match else None


def transition(
    session: Session, to: State, now: float, error: str = "", *, restarting: bool = False
) -> Session:
    """Move to ``to`` or raise Conflict naming the illegal move. The new record carries the
    restart's mark only when ``restarting`` says so: any other move clears it."""
    if to not in TRANSITIONS[session.state]:
        raise Conflict(f"session {session.sid}: cannot go from {session.state.value} to {to.value}")
    return replace(session, state=to, updated_at=now, error=error, restarting=restarting)
