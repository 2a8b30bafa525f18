"""The host-user attacks of test_attack_hosts.py (tests/redteam/host_attacks.py), run by a host
account with the agent's own uid and gid (10000).

That uid owns a session's key file (0400) and its outbound tmpfs on the host: runsc 20221219 does
not translate ids (ironclawd/domain/agents.py), so whatever the host shows of a session the box
can write is the agent uid's. What keeps such an account out is the way there: the keys
directory is root's 0700, the outbound tmpfs lives in the daemon's own mount namespace (reached
only through a root thread's ``/proc/<tid>/root``), the queues under the 0700 state directory.
Nothing reserves uid 10000 on a host (docs/threat-model.md: A4 is every user outside
``ironclaw-admin``), so an operator's ordinary account may have it; the throwaway account made
here stands for it. The root control of test_attack_hosts.py shows every target is real.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from ironclawd.domain.agents import AGENT_GID, AGENT_UID
from tests.harness.private_systemd import SystemdHarness
from tests.redteam.conftest import RUNNING, out, sh
from tests.redteam.report import Ledger
from tests.redteam.test_attack_hosts import (
    Target,
    judged_attacks,
    target,  # noqa: F401 - the module's session and its parameters, a fixture
)

pytestmark = pytest.mark.redteam

NAME = f"rtagent{secrets.token_hex(3)}"


@pytest.fixture(scope="module")
def agent_uid_user(daemon: SystemdHarness) -> Iterator[str]:
    """A host account whose uid and gid are the agent's: the one already there, else made."""
    existing = daemon.run(["getent", "passwd", str(AGENT_UID)])
    if existing.returncode == 0:
        yield out(existing).split(":", 1)[0]
        return
    script = f"""
        set -e
        getent group {AGENT_GID} >/dev/null || groupadd -g {AGENT_GID} {NAME}
        useradd -M -u {AGENT_UID} -g {AGENT_GID} -s /usr/sbin/nologin {NAME}
    """
    proc = sh(daemon, script)
    assert proc.returncode == 0, out(proc)
    try:
        yield NAME
    finally:
        daemon.run(["userdel", NAME])
        daemon.run(["groupdel", NAME])


def test_a_host_account_with_the_agents_uid_reaches_nothing_of_a_session(
    target: Target,  # noqa: F811 - the fixture imported above
    daemon: SystemdHarness,
    ledger: Ledger,
    agent_uid_user: str,
) -> None:
    # Control: the account really is the agent's uid and gid, and owns the session's key file.
    ids = out(daemon.run(["id", "-u"], user=agent_uid_user)).strip()
    gids = out(daemon.run(["id", "-g"], user=agent_uid_user)).strip()
    assert (ids, gids) == (str(AGENT_UID), str(AGENT_GID)), (ids, gids)
    key = f"/run/ironclaw/keys/{target.box.sid}"
    owner = out(daemon.run(["stat", "-c", "%u", key])).strip()
    assert owner == str(AGENT_UID), f"control: {key} is owned by {owner}"

    escaped = judged_attacks(daemon, ledger, target, agent_uid_user,
                             f"as the agent's uid {AGENT_UID}", "agent-uid",
                             " (as a host account with the agent's uid)")  # fmt: skip
    assert target.box.state() == RUNNING
    assert target.box.send("still here").endswith("still here")
    assert not escaped, escaped
