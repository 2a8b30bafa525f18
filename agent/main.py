"""The in-box agent: answers its session's messages; it has no other mode.

Open the session's key and queues, connect to ``$IRONCLAW_CONTROL_SOCKET`` (a Unix stream socket
the host serves in the session's sockets directory), say ``hello <pid> <uid>`` and answer every
inbound message once, in order (agent/loop.py); when the host goes away (a daemon restart),
reconnect and say hello again so that the new daemon adopts this sandbox. The red-team probe the
tests run inside the box is a separate, test-only program (``redteam_probe/``) that the shipped
agent image does not contain.

Standard library only, and nothing of ``ironclawd`` (import-linter contract): this module is
frozen into a standalone executable that runs in a rootfs with no interpreter.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import sqlcipher3

from agent.loop import KEY_FILE, Agent
from agent.model import warm_grpc
from agent.queues import QueueError

DEFAULT_CONTROL_SOCKET = "/run/ironclaw/control.sock"
CONTROL_SOCKET_ENV = "IRONCLAW_CONTROL_SOCKET"

# The host creates the socket before starting the sandbox, but the agent must not race a host
# that is still binding it (or restarting): retry for a bounded time, then fail loudly.
CONNECT_FIRST_DELAY = 0.05
CONNECT_MAX_DELAY = 1.0
CONNECT_DEADLINE = 30.0
# After the host went away: how long a daemon restart may take before the agent gives up.
RECONNECT_DEADLINE = 600.0
# A pooled sandbox (ironclawd/services/pool.py, $IRONCLAW_POOLED) waits, without a deadline,
# for the session that claims it: its key file is empty until then. It waits in a blocked read
# on claim.sock beside the control socket, which the host serves while the sandbox is pooled
# and answers with one line once a claim has written the key and bound the session's sockets:
# no CPU while waiting, and awake the moment it is claimed. Should that socket be missing or its
# connection end without the line, it polls the key file instead (one host pread per poll,
# 5-6% of a core per waiting sandbox on ptrace; polling by connect() walked the socket directory
# through the gofer each time and cost 15%).
POOLED_ENV = "IRONCLAW_POOLED"
CLAIM_SOCKET = "claim.sock"
CLAIM_CONNECT_DEADLINE = 5.0  # the host binds it before it starts the sandbox
CLAIM_LINE_MAX = 64
POOLED_POLL = 0.02
KEY_HEX_LEN = 64
CLAIMED_CONNECT_DELAY = 0.002  # the socket is bound before the claim's line: at once, normally
# Errors that mean "not there yet": no socket file, or nobody listening on it.
_RETRYABLE_ERRNOS = frozenset({errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN})


class AgentError(Exception):
    """The agent cannot go on; the message says what it was doing."""


def connect_control(
    path: str,
    *,
    deadline: float = CONNECT_DEADLINE,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    first_delay: float = CONNECT_FIRST_DELAY,
    max_delay: float = CONNECT_MAX_DELAY,
) -> socket.socket:
    """Connect to the control socket at ``path``, retrying with capped exponential backoff."""
    give_up_at = monotonic() + deadline
    delay = first_delay
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            if exc.errno not in _RETRYABLE_ERRNOS:
                raise AgentError(f"connecting to control socket {path}: {exc}") from exc
            remaining = give_up_at - monotonic()
            if remaining <= 0:
                raise AgentError(
                    f"connecting to control socket {path}: gave up after {deadline:g} s: {exc}"
                ) from exc
            sleep(min(delay, remaining))
            delay = min(delay * 2, max_delay)
        else:
            return sock


def wait_for_key(
    path: Path, poll: float = POOLED_POLL, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Block until the key file at ``path`` holds a whole key (a pooled sandbox is claimed)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        while len(os.pread(fd, KEY_HEX_LEN, 0)) < KEY_HEX_LEN:
            sleep(poll)
    finally:
        os.close(fd)


def wait_for_claim(
    control_path: str,
    key_path: Path,
    *,
    deadline: float = CLAIM_CONNECT_DEADLINE,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Block until a session claims this pooled sandbox: the host's line on claim.sock (beside
    ``control_path``), then the whole key in ``key_path``; by polling the key file alone when
    that socket cannot be reached or its connection ends without the line."""
    claim = os.path.join(os.path.dirname(control_path), CLAIM_SOCKET)
    with (
        contextlib.suppress(AgentError, OSError),
        connect_control(claim, deadline=deadline, sleep=sleep) as sock,
    ):
        sock.recv(CLAIM_LINE_MAX)  # the line, or b"" when the host went away
    wait_for_key(key_path, sleep=sleep)


def run_control(path: str, *, pooled: bool = False) -> int:
    """Say hello on the control socket and hold it open; when the host goes away (a daemon
    restart), reconnect and say hello again so the new daemon can adopt this sandbox. Returns
    only if the host stays away past RECONNECT_DEADLINE (raises AgentError). ``pooled``: wait
    for a claim first, for as long as it takes, and only then open the key and queues."""
    first_delay = CONNECT_FIRST_DELAY
    if pooled:
        warm_grpc()  # while nobody waits for this sandbox, not on its first message
        wait_for_claim(path, KEY_FILE)
        first_delay = CLAIMED_CONNECT_DELAY
    try:
        worker = Agent()
    except (OSError, ValueError, QueueError, sqlcipher3.Error) as exc:
        raise AgentError(f"opening the session's key and queues: {exc}") from exc
    deadline = CONNECT_DEADLINE
    claimed = pooled  # the first connection only: a reconnect follows a daemon restart
    while True:
        with (
            connect_control(path, deadline=deadline, first_delay=first_delay) as sock,
            contextlib.suppress(ConnectionResetError, BrokenPipeError),
        ):
            worker.serve(sock, claimed=claimed)
        claimed = False
        deadline = RECONNECT_DEADLINE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the agent; returns the process exit status."""
    # No options: ``-h`` prints usage and anything else is refused (argparse exits 2).
    argparse.ArgumentParser(prog="agent", description="IronClaw in-box agent").parse_args(argv)
    path = os.environ.get(CONTROL_SOCKET_ENV) or DEFAULT_CONTROL_SOCKET
    try:
        return run_control(path, pooled=os.environ.get(POOLED_ENV) == "1")
    except AgentError as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"agent: control socket {path}: {exc}", file=sys.stderr)
        return 1
