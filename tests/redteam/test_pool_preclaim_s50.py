"""A warm pool's sandbox attacked from inside *before* its claim (docs/threat-model.md B11, T):
what its agent leaves in its outbound directory must not tamper with what the claim brings in.

The red-team battle on a pooled sandbox (test_attack_sandbox.py) runs after the claim; the seal's
refusals were tested only on a temporary directory (tests/unit/test_pooled_seal.py). Here the
probe runs as the agent's uid in an unclaimed pooled sandbox, then ``ironctl session create``
claims it:

- ``outbound.db`` planted as a link to a host path (probe attack
  ``queues.pool.outbound-db-planted``, added for this test): the claim is refused, the sandbox
  torn down, the host path never created, and the pool's next sandbox serves the next create;
- a setuid+setgid file planted (``queues.setid.outbound-file``): the claim goes ahead, and the
  host's copy has no setid bits once the session runs (stripped at seal and at each read).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import pytest

from tests.harness.pool import pooled_daemon, wait_pool_ready
from tests.harness.private_systemd import SystemdHarness
from tests.redteam.conftest import (
    RUNNING,
    Sandbox,
    Sessions,
    journal_cursor,
    journal_since,
    module_sessions,
    out,
    record,
    sh,
    sh_outbound,
)
from tests.redteam.report import Ledger
from tests.redteam.verdicts import setid_verdict

pytestmark = pytest.mark.redteam

QUEUES = "/var/lib/ironclaw/queues"
REFUSED_CLAIM = "claiming a pooled sandbox for session"


@pytest.fixture
def pool(daemon: SystemdHarness) -> Iterator[Sessions]:
    with pooled_daemon(daemon), module_sessions(daemon, pooled=True) as sessions:
        yield sessions


def _waiting(sysd: SystemdHarness) -> Sandbox:
    """The pool's one ready sandbox, not yet claimed: its socket directory holds claim.sock."""
    wait_pool_ready(sysd)
    listed = sysd.run(["bash", "-c", "ls /run/ironclaw/sessions/*/claim.sock"])
    assert listed.returncode == 0, out(listed)
    paths = listed.stdout.decode().split()
    assert len(paths) == 1, paths  # a pool of one, waiting
    box = Sandbox(sysd, paths[0].split("/")[-2])
    shown = sysd.run(["ironctl", "session", "show", box.sid, "--json"])
    assert shown.returncode != 0, f"control: {box.sid} is no session yet: {out(shown)}"
    return box


def test_an_outbound_db_planted_before_the_claim_refuses_it_and_is_never_followed(
    daemon: SystemdHarness, pool: Sessions, ledger: Ledger
) -> None:
    victim_dir = f"/var/lib/ironclaw-redteam-{secrets.token_hex(4)}"
    victim = f"{victim_dir}/created-by-the-claim"
    assert sh(daemon, f"mkdir {victim_dir} && echo keep > {victim_dir}/marker").returncode == 0
    try:
        box = _waiting(daemon)
        raw = box.attacks("queues", only="queues.pool.outbound-db-planted", plant_target=victim)
        planted = raw["queues.pool.outbound-db-planted"]
        # The link is there on the host, in the daemon's outbound namespace (the target check).
        link = out(sh_outbound(daemon, f"readlink {QUEUES}/{box.sid}/outbound/outbound.db"))
        mark = journal_cursor(daemon)
        created = daemon.run(["ironctl", "session", "create", "--agent", "demo", "--json"])
        journal = journal_since(daemon, mark)
        claimed_it = f"{REFUSED_CLAIM} {box.sid}" in journal
        if created.returncode == 0:  # taken anyway: remove it with the others
            pool.created.append(Sandbox(daemon, str(json.loads(created.stdout)["sid"])))
        else:
            daemon.run(["ironctl", "session", "rm", "--force", box.sid])
        unit = out(daemon.run(["systemctl", "is-active", box.unit])).strip()
        followed = daemon.run(["test", "-e", victim]).returncode == 0
        marker = out(daemon.run(["cat", f"{victim_dir}/marker"])).strip()
        # The pool serves the next create from a fresh sandbox.
        after = pool.create()
        fresh = after.sid != box.sid and after.send("after").endswith("after")
    finally:
        daemon.run(["rm", "-rf", victim_dir])
    contained = (
        planted["ok"] is True and link.strip() == victim and created.returncode != 0
        and claimed_it and unit != "active" and not followed and marker == "keep" and fresh
    )  # fmt: skip
    record(
        ledger, "queues.pool.outbound-db-planted", "queues",
        "before a claim, plant outbound.db as a link to a host path for the claim to follow",
        contained,
        f"planted: {planted['detail'][:100]}; host link {link.strip()!r}; create exit "
        f"{created.returncode} ({out(created)[-120:]!r}); refusal logged {claimed_it}; unit "
        f"{unit}; host path created {followed}; next create served fresh {fresh}",
        error=planted["ok"] is not True,
    )  # fmt: skip
    assert planted["ok"] is True, f"the attack did not run: {planted}"
    assert link.strip() == victim, f"control: no planted link on the host: {link!r}"
    assert created.returncode != 0, f"the claim took a planted outbound.db: {out(created)}"
    assert claimed_it, journal[-2000:]
    assert not followed, f"root created {victim} through the planted link"
    assert marker == "keep"
    assert unit != "active", f"the refused sandbox still runs: {unit}"
    assert fresh, after.sid


def test_setid_bits_planted_before_the_claim_never_reach_the_host(
    daemon: SystemdHarness, pool: Sessions, ledger: Ledger
) -> None:
    box = _waiting(daemon)
    name = f"rt-setid-{secrets.token_hex(3)}"
    raw = box.attacks("queues", only="queues.setid.outbound-file", setid_name=name)
    result = raw["queues.setid.outbound-file"]
    claimed = pool.create()
    assert claimed.sid == box.sid, "the create did not claim the attacked sandbox"
    assert claimed.send("after the attack").endswith("after the attack")
    path = f"{QUEUES}/{box.sid}/outbound/{name}"
    host = out(sh_outbound(daemon, f"stat -c '%a %F' {path}")).strip()
    contained, error, why = setid_verdict(result, host)
    record(
        ledger, "queues.setid.outbound-file.pool-preclaim", "queues",
        "before a claim, create a setuid+setgid file in the outbound dir", contained,
        f"{why}; inside {result['detail'][:200]}", error=error,
    )  # fmt: skip
    assert not error, why
    assert contained, why
    assert claimed.state() == RUNNING
