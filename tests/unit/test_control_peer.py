"""Who may talk on a session's control socket: the whole cgroup path of the unit, nothing less."""

from __future__ import annotations

import pytest

from ironclawd.api.control import in_unit_cgroup, systemd_root
from ironclawd.errors import HostError

UNIT = "ironclaw-sbx-ab12cd34ef56.service"
UNIFIED_PID1 = "0::/init.scope\n"
LEGACY_PID1 = "9:name=systemd:/init.scope\n4:memory:/\n0::/\n"
HYBRID_PID1 = "12:memory:/init.scope\n1:name=systemd:/init.scope\n0::/init.scope\n"


def test_systemd_root_on_a_host_is_the_top() -> None:
    assert systemd_root("0::/init.scope\n") == ""
    assert systemd_root(HYBRID_PID1) == ""


def test_systemd_root_inside_a_container_or_the_harness() -> None:
    assert systemd_root("0::/ironclaw-test-1/init.scope\n") == "/ironclaw-test-1"
    assert systemd_root("1:name=systemd:/machine.slice/x.scope/init.scope\n") == (
        "/machine.slice/x.scope"
    )


def test_systemd_root_refuses_a_pid1_without_systemd_hierarchy() -> None:
    with pytest.raises(HostError, match="no systemd hierarchy"):
        systemd_root("4:memory:/\n")


def test_the_units_own_cgroup_matches() -> None:
    text = f"1:name=systemd:/ironclaw.slice/{UNIT}\n0::/ironclaw.slice/{UNIT}\n"
    assert in_unit_cgroup(text, UNIFIED_PID1, UNIT)
    assert in_unit_cgroup(text, HYBRID_PID1, UNIT)
    assert in_unit_cgroup(f"12:memory:/\n{text}", HYBRID_PID1, UNIT)
    assert in_unit_cgroup(
        f"0::/ironclaw-test-1/ironclaw.slice/{UNIT}\n", "0::/ironclaw-test-1/init.scope\n", UNIT
    )


def test_on_a_legacy_host_the_name_systemd_hierarchy_is_read_not_the_unmanaged_unified_one() -> (
    None
):
    """With systemd on the v1 hierarchy, ``0::/`` is every process's line: the unit is read in
    ``name=systemd``. (Requiring every systemd-looking line to name the unit refused every
    sandbox there, and a process the test harness moves into a unit in v1's hierarchy.)"""
    assert in_unit_cgroup(f"9:name=systemd:/ironclaw.slice/{UNIT}\n4:memory:/\n0::/\n",
                          LEGACY_PID1, UNIT)  # fmt: skip
    assert not in_unit_cgroup(f"9:name=systemd:/user.slice\n0::/ironclaw.slice/{UNIT}\n",
                              LEGACY_PID1, UNIT)  # fmt: skip


@pytest.mark.parametrize(
    "path",
    [
        # A user's delegated subtree (user@.service has Delegate=yes) with the same last name.
        f"/user.slice/user-1000.slice/user@1000.service/{UNIT}",
        f"/user.slice/user-1000.slice/user@1000.service/ironclaw.slice/{UNIT}",
        f"/ironclaw.slice/{UNIT}/child",
        f"/ironclaw.slice/x{UNIT}",
        "/ironclaw.slice/ironclaw-sbx-other.service",
    ],
)
def test_a_cgroup_that_only_ends_like_the_unit_does_not_match(path: str) -> None:
    text = f"0::{path}\n1:name=systemd:{path}\n"
    assert not in_unit_cgroup(text, UNIFIED_PID1, UNIT)
    assert not in_unit_cgroup(text, HYBRID_PID1, UNIT)


def test_a_controller_hierarchy_alone_does_not_place_a_peer_in_the_unit() -> None:
    """Only the hierarchies systemd manages say where systemd put a process: a v1
    controller's own hierarchy (cpu, memory) naming the unit's path, with the systemd
    hierarchies elsewhere, is not the unit."""
    elsewhere = "/user.slice/user-1000.slice/session-1.scope"
    text = f"4:memory:/ironclaw.slice/{UNIT}\n1:name=systemd:{elsewhere}\n0::{elsewhere}\n"
    assert not in_unit_cgroup(text, HYBRID_PID1, UNIT)
    assert not in_unit_cgroup(f"4:memory:/ironclaw.slice/{UNIT}\n", HYBRID_PID1, UNIT)
    assert not in_unit_cgroup(f"4:memory:/ironclaw.slice/{UNIT}\n0::/\n", LEGACY_PID1, UNIT)


def test_the_unit_is_read_in_the_hierarchy_systemd_tracks_units_in() -> None:
    """On a hybrid host systemd's first line is v1's name=systemd, as for the root: a process
    there in the unit is in it, one only in the unified hierarchy's unit is not."""
    assert in_unit_cgroup(f"1:name=systemd:/ironclaw.slice/{UNIT}\n0::/user.slice/x.scope\n",
                          HYBRID_PID1, UNIT)  # fmt: skip
    assert not in_unit_cgroup(f"1:name=systemd:/user.slice/x.scope\n0::/ironclaw.slice/{UNIT}\n",
                              HYBRID_PID1, UNIT)  # fmt: skip
    assert not in_unit_cgroup("", HYBRID_PID1, UNIT)
