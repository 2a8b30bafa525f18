"""Who may talk on a session's control socket: the whole cgroup path of the unit, nothing less."""

from __future__ import annotations

import pytest

from ironclawd.api.control import cgroup_paths, systemd_root, unit_cgroup
from ironclawd.errors import HostError

UNIT = "ironclaw-sbx-ab12cd34ef56.service"
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
    assert unit_cgroup("", UNIT) in cgroup_paths(text)


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
    assert unit_cgroup("", UNIT) not in cgroup_paths(f"0::{path}\n1:name=systemd:{path}\n")
