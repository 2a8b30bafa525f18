"""A warm pool's sandbox holds nothing of the session that claimed the one before it (issue 17),
and only its own unit may wait on the socket where its agent waits for a claim.

Session A claims a pooled sandbox, is sent a message and removed; session B then claims the
next pooled sandbox. From inside B, with the red-team probe, as the agent's uid: B's key is not
A's; A's key (as the box reads it) and A's id are in none of B's readable files (``/proc``
included); A's sockets and queue directories are not there. The same probe in A found both
first (positive controls), so the search can see what it looks for.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.pool import pooled_daemon, wait_pool_ready
from tests.harness.private_systemd import SystemdHarness
from tests.redteam.conftest import (
    Sandbox,
    Sessions,
    journal_cursor,
    journal_since,
    out,
    record_outcome,
)
from tests.redteam.report import Ledger

pytestmark = pytest.mark.redteam

KEY_IN_BOX = "/run/ironclaw-key"
PYTHON = "/usr/bin/python3"
CLAIM_REFUSAL = "refused a claim connection from outside its unit"
# Connect and wait for what the host says: "line" (it answered), "closed" (it ended the
# connection without a word), "kept" (still waiting after 5 s: it was let in).
_CONNECT_AND_WAIT = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
s.connect(sys.argv[1])
try:
    print("line" if s.recv(64) else "closed")
except socket.timeout:
    print("kept")
except OSError:
    print("closed")
"""


@pytest.fixture
def recorded(request: pytest.FixtureRequest, ledger: Ledger) -> Iterator[None]:
    yield
    record_outcome(
        request, ledger, "secrets.pool-previous-session", "secrets",
        "find anything of the session that claimed the previous pooled sandbox",
    )  # fmt: skip


def host_key(box: Sandbox) -> str:
    """The session's key as the box reads it (hex text on the host's tmpfs)."""
    proc = box.sysd.run(["cat", f"/run/ironclaw/keys/{box.sid}"])
    assert proc.returncode == 0, out(proc)
    text = proc.stdout.decode().strip()
    assert len(text) == 64, "control: a 256-bit key in hex"
    return text


def test_a_pooled_sandbox_holds_nothing_of_the_previous_session(
    daemon: SystemdHarness, recorded: None
) -> None:
    with pooled_daemon(daemon):
        sessions = Sessions(daemon, pooled=True)
        try:
            a = sessions.create()
            assert a.send("a secret for A only").endswith("a secret for A only")
            a_key = host_key(a)
            needles = {"key": a_key.encode().hex(), "sid": a.sid.encode().hex()}
            seen_in_a = a.probe(*(f"--probe-grep={h}" for h in needles.values()),
                                f"--probe-path={KEY_IN_BOX}")  # fmt: skip
            # Positive controls: inside A the probe finds A's key file and A's id.
            assert KEY_IN_BOX in seen_in_a["grep"]["hits"][needles["key"]], seen_in_a["grep"]
            assert seen_in_a["grep"]["hits"][needles["sid"]], seen_in_a["grep"]
            a_key_digest = seen_in_a["paths"][KEY_IN_BOX]["sha256"]
            assert a_key_digest, seen_in_a["paths"]
            proc = daemon.run(["ironctl", "session", "rm", "--force", a.sid])
            assert proc.returncode == 0, out(proc)
            sessions.created.remove(a)

            b = sessions.create()
            assert b.sid != a.sid
            assert b.send("hello B").endswith("hello B")  # B's own key and queues work
            a_paths = [f"/run/ironclaw/sessions/{a.sid}", f"/var/lib/ironclaw/queues/{a.sid}",
                       f"/run/ironclaw/keys/{a.sid}"]  # fmt: skip
            # Two probes: the second names A's paths (and so A's id) in its own command line.
            seen_in_b = b.probe(
                *(f"--probe-grep={h}" for h in needles.values()), f"--probe-path={KEY_IN_BOX}"
            )
            looked = b.probe(*(f"--probe-path={p}" for p in a_paths))["paths"]
            grep = seen_in_b["grep"]
            assert grep["files"] > 50, grep  # it searched
            assert grep["hits"][needles["key"]] == [], grep
            assert grep["hits"][needles["sid"]] == [], grep
            b_key = seen_in_b["paths"][KEY_IN_BOX]
            assert b_key["readable"], b_key
            assert b_key["sha256"] != a_key_digest, "B holds A's key"
            assert host_key(b) != a_key
            for path in a_paths:
                assert not looked[path]["exists"], looked[path]
        finally:
            failures = sessions.remove_all()
            assert not failures, failures


@pytest.fixture
def recorded_claim(request: pytest.FixtureRequest, ledger: Ledger) -> Iterator[None]:
    yield
    record_outcome(
        request, ledger, "host-users.pool.claim-socket", "host-users",
        "wait on a pooled sandbox's claim socket (to learn of its claim, or take its place)",
        "host-user",
    )  # fmt: skip


def test_host_user_is_turned_away_from_a_pooled_sandboxs_claim_socket(
    daemon: SystemdHarness, recorded_claim: None
) -> None:
    """A pooled sandbox's agent waits on ``claim.sock`` in its sockets directory until a session
    claims it. The socket is mode 0666 (runsc's host side runs as a uid of its choosing): a host
    user who knows the path can connect, and must be closed out at once, with nothing said,
    while the pooled sandbox stays claimable."""
    with pooled_daemon(daemon):
        sessions = Sessions(daemon, pooled=True)
        try:
            wait_pool_ready(daemon)
            listed = daemon.run(["bash", "-c", "ls /run/ironclaw/sessions/*/claim.sock"])
            assert listed.returncode == 0, out(listed)
            paths = listed.stdout.decode().split()
            assert len(paths) == 1, paths  # a pool of one, waiting
            waiting_sid = paths[0].split("/")[-2]
            mark = journal_cursor(daemon)
            proc = daemon.run([PYTHON, "-c", _CONNECT_AND_WAIT, paths[0]], user="outsider")
            assert proc.returncode == 0, out(proc)
            assert proc.stdout.decode().strip() == "closed", out(proc)
            assert f"session {waiting_sid}: {CLAIM_REFUSAL}" in journal_since(daemon, mark)
            # Still claimable: the claim wakes its agent, and the socket is gone after it.
            box = sessions.create()
            assert box.sid == waiting_sid
            assert box.send("after the knock").endswith("after the knock")
            gone = daemon.run(["test", "-e", paths[0]])
            assert gone.returncode == 1, "claim.sock outlived the claim"
        finally:
            failures = sessions.remove_all()
            assert not failures, failures
