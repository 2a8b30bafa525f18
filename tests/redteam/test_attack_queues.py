"""Attacks on ingestion from inside a real session (redteam_probe/probes/queues.py): hostile rows in
outbound.db, swapping outbound.db for a link to a host FIFO while announcing commits, filling
the outbound directory, setid bits, and a link planted for ``session rm`` to follow. Each
attack gets a fresh session; afterwards the host must still ingest that session's replies,
serve the others, and hold nothing the box chose."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator

import pytest

from tests.harness.private_systemd import SystemdHarness
from tests.redteam.conftest import (
    RUNNING,
    Sandbox,
    Sessions,
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
ROWS = {
    "queues.row.negative-in-reply-to": "an outbound row with in_reply_to = -1",
    "queues.row.non-utf8-body": "an outbound row whose body is not UTF-8",
    "queues.row.oversized-body": "a 20 MiB outbound row",
    "queues.rows.flood-20000": "20,000 outbound rows in one commit",
}
# Rows that answer no message sent to the session: held in its own queue since stop 51
# (unit/test_reply_flood.py), where the others are quarantined and ingestion goes on.
HELD = {"queues.rows.flood-20000"}


@pytest.fixture(scope="module")
def made(daemon: SystemdHarness) -> Iterator[Sessions]:
    with module_sessions(daemon) as sessions:
        yield sessions


@pytest.fixture(scope="module")
def bystander(made: Sessions) -> Sandbox:
    """Another session, which must keep answering whatever the attacker does."""
    box = made.create()
    assert box.send("hello").endswith("hello")
    return box


def _fresh(made: Sessions) -> Sandbox:
    box = made.create()
    assert box.send("first").endswith("first")  # control: ingestion works before the attack
    return box


def _still_ingests(box: Sandbox, bystander: Sandbox, wait: float = 90) -> tuple[bool, str]:
    start = time.monotonic()
    try:
        own = box.send("after the attack", timeout=wait)
    except AssertionError as exc:
        own = f"no reply within {wait:.0f} s ({str(exc).splitlines()[0][:60]})"
    theirs = bystander.send("meanwhile", timeout=60)
    seconds = time.monotonic() - start
    ok = own.endswith("after the attack") and theirs.endswith("meanwhile")
    ok = ok and box.state() == RUNNING and bystander.state() == RUNNING
    return ok, f"after: own reply {own[-40:]!r}, bystander {theirs[-20:]!r} in {seconds:.1f} s"


def _held_alone(box: Sandbox, bystander: Sandbox, wait: float = 90) -> tuple[bool, str]:
    """A flood of well-formed rows answering no message sent is held in the box's own queue
    (on its own tmpfs, never the host's disk): the session's error says so and what to do, it
    keeps running, and the bystander is answered."""
    deadline, error = time.monotonic() + wait, ""
    while time.monotonic() < deadline:
        error = str(box.shown().get("error", ""))
        if "replies held in its outbound queue" in error:
            break
        time.sleep(1)
    theirs = bystander.send("meanwhile", timeout=60)
    held = "replies held in its outbound queue" in error
    ok = held and theirs.endswith("meanwhile")
    ok = ok and box.state() == RUNNING and bystander.state() == RUNNING
    return ok, f"after: own session held={held} ({error[:80]!r}), bystander {theirs[-20:]!r}"


@pytest.mark.parametrize("attack_id", sorted(ROWS))
def test_hostile_rows_never_wedge_ingestion(
    made: Sessions, bystander: Sandbox, ledger: Ledger, attack_id: str
) -> None:
    box = _fresh(made)
    raw = box.attacks("queues", only=attack_id, timeout=300)[attack_id]
    if attack_id in HELD:
        ok, note = _held_alone(box, bystander)
    else:
        ok, note = _still_ingests(box, bystander)
    active = out(box.sysd.run(["systemctl", "is-active", "ironclawd"])).strip() == "active"
    contained = bool(raw["ok"]) and ok and active
    record(ledger, attack_id, "queues", ROWS[attack_id], contained,
           f"wrote and announced: {raw['detail']}; {note}; daemon {active=}",
           error=raw["ok"] is None)  # fmt: skip
    assert raw["ok"], raw
    assert contained, note


def test_swap_of_outbound_db_for_a_host_fifo(
    made: Sessions, bystander: Sandbox, ledger: Ledger
) -> None:
    """The race of issue 10: rename() a symlink to a host FIFO over outbound.db and announce
    a commit, again and again. A host writer blocked on the FIFO says whether anyone (the
    root daemon) ever opened it for reading."""
    box = _fresh(made)
    sysd = box.sysd
    fifo = f"/run/ironclaw-redteam-{secrets.token_hex(4)}.fifo"
    assert sysd.run(["mkfifo", "-m", "0666", fifo]).returncode == 0
    opened: list[str] = []
    watch = threading.Thread(target=lambda: opened.append(out(sh(
        sysd, f"timeout 25 bash -c 'exec 3>{fifo} && echo opened'", timeout=40))))  # fmt: skip
    watch.start()
    try:
        meanwhile: list[object] = []

        def race() -> None:
            try:
                meanwhile.append(
                    box.attacks(
                        "queues",
                        only="queues.race.swap-to-host-fifo",
                        race_target=fifo,
                        race_seconds=10,
                        timeout=120,
                    )
                )
            except BaseException as exc:  # reported below with what the host saw
                meanwhile.append(exc)

        racer = threading.Thread(target=race)  # fmt: skip
        racer.start()
        time.sleep(2)  # the race is on: another session must be served meanwhile
        start = time.monotonic()
        theirs = bystander.send("during the race", timeout=60)
        during = time.monotonic() - start
        racer.join()
        watch.join()
    finally:
        sysd.run(["rm", "-f", fifo])
    if isinstance(meanwhile[0], BaseException):
        raise meanwhile[0]
    raw = meanwhile[0]["queues.race.swap-to-host-fifo"]  # type: ignore[index]
    # What is attacked here is the host (a path the agent chose, opened by root) and the other
    # sessions. The attacker's own session is its own to wreck (it may stop answering at will):
    # whether it still answers is reported, not judged.
    _own_ok, note = _still_ingests(box, bystander, wait=60)
    after = bystander.send("after the race", timeout=60)
    never_opened = "opened" not in opened[0]
    active = out(sysd.run(["systemctl", "is-active", "ironclawd"])).strip() == "active"
    contained = bool(raw["ok"]) and never_opened and theirs.endswith("during the race")
    contained = contained and after.endswith("after the race") and active
    record(ledger, "queues.race.swap-to-host-fifo", "queues",
           "swap outbound.db for a symlink to a host FIFO while announcing commits", contained,
           f"{raw['detail']}; host FIFO opened by the daemon: {not never_opened}; bystander "
           f"answered during the race in {during:.1f} s; {note}",
           error=raw["ok"] is None)  # fmt: skip
    assert raw["ok"], raw
    assert never_opened, "the daemon opened the host FIFO the box pointed outbound.db at"
    assert contained, note


def test_outbound_dir_has_a_quota(made: Sessions, bystander: Sandbox, ledger: Ledger) -> None:
    box = _fresh(made)
    raw = box.attacks("queues", only="queues.quota.outbound-fill", timeout=300)
    result = raw["queues.quota.outbound-fill"]
    usage = out(sh_outbound(box.sysd, f"du -sb {QUEUES}/{box.sid}/outbound | cut -f1")).strip()
    ok, note = _still_ingests(box, bystander)
    detail = result["detail"]
    refused = result["ok"] and ('"errno": 28' in detail or '"errno": 122' in detail)
    contained = bool(refused) and ok
    record(ledger, "queues.quota.outbound-fill", "queues",
           "fill the outbound dir (a host dir) with 96 MiB and 25,000 files", contained,
           f"{detail}; host usage afterwards {usage} bytes; {note}")  # fmt: skip
    assert contained, (detail, note)


def test_setid_bits_never_reach_the_host(
    made: Sessions, bystander: Sandbox, ledger: Ledger
) -> None:
    box = _fresh(made)
    name = f"rt-setid-{secrets.token_hex(3)}"
    raw = box.attacks("queues", only="queues.setid.outbound-file", setid_name=name)
    result = raw["queues.setid.outbound-file"]
    # The daemon strips what the box planted whenever it reads the queue: make it read.
    assert box.send("after the attack").endswith("after the attack")
    path = f"{QUEUES}/{box.sid}/outbound/{name}"
    host = out(sh_outbound(box.sysd, f"stat -c '%a %F' {path}")).strip()
    mount = out(sh_outbound(box.sysd, f"findmnt -no FSTYPE,OPTIONS -T {path}")).split()
    contained, error, why = setid_verdict(result, host)
    record(ledger, "queues.setid.outbound-file", "queues",
           "create a setuid+setgid file in the outbound dir", contained,
           f"{why}; inside {result['detail']}; host mount {' '.join(mount)}",
           error=error)  # fmt: skip
    assert not error, why
    assert contained, why


def test_planted_symlink_before_session_rm(daemon: SystemdHarness, ledger: Ledger) -> None:
    sessions = Sessions(daemon)
    box = _fresh(sessions)
    victim = f"/var/lib/ironclaw-redteam-{secrets.token_hex(4)}"
    assert sh(daemon, f"mkdir {victim} && echo keep > {victim}/marker").returncode == 0
    try:
        raw = box.attacks("queues", only="queues.rm.planted-symlink", plant_target=victim)
        result = raw["queues.rm.planted-symlink"]
        proc = daemon.run(["ironctl", "session", "rm", "--force", box.sid])
        if proc.returncode != 0:
            sessions.remove_all()  # leave nothing behind for later tests either way
        left = out(sh(daemon, f"ls -A {QUEUES}/{box.sid} 2>&1; cat {victim}/marker"))
    finally:
        daemon.run(["rm", "-rf", victim])
    marker_kept = left.strip().endswith("keep")
    gone = "No such file" in left
    contained = bool(result["ok"]) and proc.returncode == 0 and marker_kept and gone
    record(ledger, "queues.rm.planted-symlink", "queues",
           "plant symlinks to a host dir in the outbound dir, then session rm", contained,
           f"planted: {result['detail']}; rm exit {proc.returncode} {out(proc)[:120]!r}; host "
           f"marker kept: {marker_kept}; queue dir gone: {gone}")  # fmt: skip
    assert contained, (out(proc), left)
