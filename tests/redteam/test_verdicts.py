"""The red-team tier's own judging, without a sandbox (pure; needs neither root nor systemd):
how an exhaustion or setid attack is judged (tests/redteam/verdicts.py), that the probe's
attacks on the session's own files report a target that is not there as a probe error
(redteam_probe/probes/base.py ``target``) at the paths the daemon really uses, and the strict
xfails' dedicated exception."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from ironclawd.api.control import CONTROL_SOCKET
from ironclawd.bundle import rootfs, spec
from ironclawd.store.outbound import OUTBOUND_FILE
from ironclawd.store.queues import INBOUND_FILE
from redteam_probe.probes import exhaust, fs, queues
from redteam_probe.probes.base import MissingTarget, attempt, target
from tests.harness.known_gaps import KnownGap
from tests.redteam.host_attacks import _sandbox_mem
from tests.redteam.verdicts import (
    Bounds,
    Fate,
    balloon_bounds,
    cpu_bounds,
    disk_bounds,
    flood_bounds,
    fork_bounds,
    inode_bounds,
    judge,
    kernel_evidence,
    setid_verdict,
)

UNIT = "ironclaw-sbx-1vy4xcdnz5aq.service"
# As the kernel logged them on this project's machines (kernel 6.18, cgroup v1).
DMESG = f"""\
[13354.482233] cgroup: fork rejected by pids controller in /ironclaw-test-6a262f98/ironclaw.slice/{UNIT}
[13369.553653] exe invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0
[13369.554184] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/ironclaw-test-6a262f98/ironclaw.slice/ironclaw-sbx-s7zqdg85wszl.service,task_memcg=/ironclaw-test-6a262f98/ironclaw.slice/ironclaw-sbx-s7zqdg85wszl.service,task=exe,pid=21727,uid=65534
"""  # noqa: E501

DIED_OOM = Fate("failed", "sandbox exited (unit result: signal)", oom=True)
DIED_PIDS = Fate("failed", "sandbox exited (unit result: exit-code)", pids_refused=True)
DIED_UNEXPLAINED = Fate("failed", "sandbox exited (unit result: exit-code)")
ALIVE = Fate("running")


def _held(_outcome: Any) -> Bounds:
    return Bounds(True, True, "ran and was held")


def test_kernel_evidence_names_only_the_units_own_cgroups() -> None:
    assert kernel_evidence(DMESG, UNIT) == (False, True)
    assert kernel_evidence(DMESG, "ironclaw-sbx-s7zqdg85wszl.service") == (True, False)
    assert kernel_evidence(DMESG, "ironclaw-sbx-s7zqdg85wszl") == (False, False)
    assert kernel_evidence(DMESG, "ironclaw-sbx-other.service") == (False, False)
    assert kernel_evidence("", UNIT) == (False, False)


def test_a_failed_exec_is_contained_only_with_the_kernels_word_and_a_box_that_ended() -> None:
    failed_exec = {"exec": "WaitPID failed: EOF"}
    # The review's case: runsc exec failed, the box runs on, so the attack never ran.
    verdict = judge(failed_exec, ALIVE, _held, may_die=True)
    assert (verdict.contained, verdict.error) == (False, True)
    assert "never ran" in verdict.why
    for died in (DIED_OOM, DIED_PIDS):
        verdict = judge(failed_exec, died, _held, may_die=True)
        assert (verdict.contained, verdict.error) == (True, False), verdict
    # Ended, but nothing says its unit's limit ended it; or it may not die of this attack.
    assert judge(failed_exec, DIED_UNEXPLAINED, _held, may_die=True).error
    assert judge(failed_exec, DIED_OOM, _held, may_die=False).error
    assert judge(failed_exec, Fate("stopped", oom=True), _held, may_die=True).error


def test_numbers_need_the_attack_to_have_happened_and_a_limit_to_have_stopped_it() -> None:
    probe_failed = judge({"probe": {"ok": None}}, ALIVE, _held, may_die=True)
    assert (probe_failed.contained, probe_failed.error) == (False, True)
    never_ran = judge({}, ALIVE, lambda _o: Bounds(False, True, "0 forks"), may_die=True)
    assert (never_ran.contained, never_ran.error) == (False, True)
    unbounded = judge({}, ALIVE, lambda _o: Bounds(True, False, "4096 forks"), may_die=True)
    assert (unbounded.contained, unbounded.error) == (False, False)  # escaped
    assert judge({}, ALIVE, _held, may_die=False).contained
    assert judge({}, DIED_OOM, _held, may_die=True).contained
    assert judge({}, DIED_OOM, _held, may_die=False).error
    assert judge({}, DIED_UNEXPLAINED, _held, may_die=True).error


def test_exhaustion_bounds_need_a_lower_bound() -> None:
    assert fork_bounds({"forked": 0, "errno": errno.EAGAIN}, 4096)[:2] == (False, True)
    assert fork_bounds({"forked": 90, "errno": errno.EAGAIN}, 4096)[:2] == (True, True)
    assert fork_bounds({"forked": 4096, "errno": None}, 4096)[:2] == (True, False)

    assert balloon_bounds({"mib": 0}, 1024)[:2] == (False, True)  # the review's case
    assert balloon_bounds({"mib": 230, "memory_error": True}, 1024)[:2] == (True, True)
    assert balloon_bounds({"mib": 1024}, 1024)[:2] == (True, False)

    ws = 32 << 20
    assert disk_bounds({"bytes": 0, "errno": errno.ENOSPC}, ws)[:2] == (False, True)
    assert disk_bounds({"bytes": ws, "errno": errno.ENOSPC}, ws)[:2] == (True, True)
    assert disk_bounds({"bytes": 256 << 20, "errno": None}, ws)[:2] == (True, False)
    assert inode_bounds({"files": 0, "errno": errno.ENOSPC}, 100_000)[:2] == (False, True)
    assert inode_bounds({"files": 100_000, "errno": None}, 100_000)[:2] == (True, True)
    assert inode_bounds({"files": 500, "errno": errno.EIO}, 100_000)[:2] == (True, False)


def test_the_flood_must_have_been_sent_and_seen_by_the_daemon() -> None:
    sent = {"lines": 20_000, "seconds": 1.2}
    args = {"lines_sent": 20_000, "journal_max": 200}
    assert flood_bounds(sent, journal=11, refusals=10, **args)[:2] == (True, True)
    # The review's case: a flood that never happened writes no journal lines.
    assert flood_bounds(sent, journal=0, refusals=0, **args)[:2] == (False, True)
    assert flood_bounds({"lines": 500}, journal=11, refusals=10, **args)[:2] == (False, True)
    assert flood_bounds(sent, journal=20_000, refusals=20_000, **args)[:2] == (True, False)


def test_the_spin_must_have_used_about_half_the_quota() -> None:
    spin = {"cpu_seconds": 14.5, "wall_seconds": 6.1}
    args: dict[str, Any] = {"spin_seconds": 6, "quota_cores": 1.0, "wall": 12.0, "cores": 2}
    assert cpu_bounds(spin, 5.8, **args)[:2] == (True, True)
    assert cpu_bounds(spin, 0.1, **args)[:2] == (False, True)  # the review's case: 0 < host
    assert cpu_bounds(spin, None, **args)[:2] == (False, False)
    assert cpu_bounds(spin, 30.0, **args)[:2] == (True, False)
    assert cpu_bounds({"cpu_seconds": 0, "wall_seconds": 0.2}, 5.8, **args)[:2] == (False, True)
    # On a machine with fewer cores than the quota, the floor is what the machine gives.
    assert cpu_bounds(spin, 3.2, **{**args, "quota_cores": 4.0, "cores": 1}).ran is True


def _made(mode: str = "0o6755") -> dict[str, object]:
    steps = {"created": "EPERM", "fchmod": mode, "chmod": mode, "mode_inside": mode}
    return {"ok": True, "errno": None, "detail": json.dumps(steps)}


def test_setid_needs_the_host_file_to_be_there_and_says_whether_the_bits_landed() -> None:
    contained, error, why = setid_verdict(_made(), "755 regular file")
    assert (contained, error) == (True, False)
    assert "the bits were set there" in why
    assert setid_verdict(_made(), "6755 regular file")[:2] == (False, False)  # escaped
    contained, error, why = setid_verdict(_made("0o644"), "644 regular file")
    assert (contained, error) == (True, False)
    assert "never showed a setid bit" in why
    # The review's case: a failed stat was mode 0, so contained.
    missing = "stat: cannot statx '/var/lib/x': No such file or directory"
    assert setid_verdict(_made(), missing)[:2] == (False, True)
    assert setid_verdict(_made(), "")[:2] == (False, True)
    assert setid_verdict(_made(), "755 directory")[:2] == (False, True)
    assert setid_verdict({"ok": False, "detail": "EROFS"}, "755 regular file")[1] is True
    assert setid_verdict({"ok": True, "detail": "no json"}, "755 regular file")[1] is True
    old_probe = {"ok": True, "detail": '{"mode_inside": "0o6755"}'}
    assert setid_verdict(old_probe, "755 regular file")[1] is True


def test_the_probes_paths_are_the_daemons() -> None:
    assert fs.SOCKETS == spec.SOCKETS_DIR
    assert f"{spec.SOCKETS_DIR}/{CONTROL_SOCKET}" == fs.CONTROL
    assert fs.KEY == spec.KEY_FILE
    assert f"{spec.QUEUE_INBOUND_DIR}/{INBOUND_FILE}" == fs.INBOUND
    assert f"/{rootfs.APP_DIR}/{rootfs.AGENT_EXECUTABLE}" == fs.AGENT
    assert fs.WORKSPACE == exhaust.WORKSPACE == spec.WORKSPACE_DIR
    assert queues.KEY == spec.KEY_FILE
    assert queues.CONTROL == fs.CONTROL
    assert f"{spec.QUEUE_OUTBOUND_DIR}/{OUTBOUND_FILE}" == queues.OUTBOUND


def test_target_reports_a_missing_or_wrong_target_as_a_probe_error(tmp_path: Path) -> None:
    present = tmp_path / "key"
    present.write_text("k")
    assert target(str(present), stat.S_ISREG, "key") == str(present)
    with pytest.raises(MissingTarget, match="No such file"):
        target(str(tmp_path / "gone"), stat.S_ISREG, "key")
    with pytest.raises(MissingTarget, match="expected the key"):
        target(str(tmp_path), stat.S_ISREG, "key")
    outcome = attempt(lambda: target(str(tmp_path / "gone"), stat.S_ISREG, "key"))
    assert outcome["ok"] is None, outcome  # an error in the report, never "contained"


# The attacks on the session's own files, with the file each checks first.
AIMED = {
    "fs.root.overwrite-agent": "AGENT", "fs.hardlink.agent-binary": "AGENT",
    "fs.hardlink.session-key": "KEY", "fs.key.write": "KEY", "fs.key.chmod": "KEY",
    "fs.inbound.write": "INBOUND", "fs.inbound.rename": "INBOUND",
    "fs.sockets.replace": "CONTROL", "fs.sockets.unlink": "CONTROL",
    "fs.sockets.create": "SOCKETS", "fs.symlink.sockets-dir": "SOCKETS",
    "fs.umount.sockets": "SOCKETS",
}  # fmt: skip


@pytest.mark.parametrize("attack_id", sorted(AIMED))
def test_an_attack_on_a_target_that_moved_is_a_probe_error(
    attack_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never ENOENT (which the red-team tests took for a refusal): the probe error of ``target``,
    before the attack touches anything (here every target is a path in tmp_path that is not
    there, so nothing on this machine is attacked)."""
    monkeypatch.setattr(fs, AIMED[attack_id], str(tmp_path / "moved"))
    monkeypatch.setattr(fs, "WORKSPACE", str(tmp_path))
    outcome = attempt(lambda: fs.ATTACKS[attack_id]({}))
    assert outcome["ok"] is None, outcome
    assert "MissingTarget" in str(outcome["detail"]), outcome
    assert sorted(os.listdir(tmp_path)) == [], "the attack went on after the check"


def test_the_sandbox_memory_attack_reads_a_readable_mapping() -> None:
    assert _sandbox_mem(os.getpid()) == "read 16 bytes of the sandbox's memory"


def test_a_known_gap_is_an_assertion_of_its_own() -> None:
    """xfail(raises=KnownGap) takes only it: a failed control (a plain AssertionError) fails."""
    assert issubclass(KnownGap, AssertionError)
    assert not isinstance(AssertionError("control"), KnownGap)
