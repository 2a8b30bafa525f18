"""Ports whose real adapters need root and a systemd of their own: UnitManager
(host/systemd.py) and NetnsManager (host/netns.py). The real ones run only under --real-host,
inside the private systemd (tests/integration/test_contracts_real.py)."""

from __future__ import annotations

import secrets

import pytest

from ironclawd.errors import HostError
from ironclawd.host.netns import NetnsAdapter
from ironclawd.host.systemd import SystemdUnitManager
from ironclawd.ports import NetnsManager, UnitManager, UnitSpec
from tests.fakes import FakeNetns, FakeUnits


def _units(impl: str) -> UnitManager:
    return FakeUnits() if impl == "fake" else SystemdUnitManager()


def _netns(impl: str) -> NetnsManager:
    return FakeNetns() if impl == "fake" else NetnsAdapter()


def test_a_started_unit_is_active_listed_and_inactive_after_stop(host_impl: str) -> None:
    units = _units(host_impl)
    name = f"ironclaw-contract-{secrets.token_hex(4)}.service"
    spec = UnitSpec(name=name, argv=["/bin/sleep", "300"], description="contract",
                    netns_path=None, collect_mode="inactive")  # fmt: skip
    try:
        started = units.start_transient(spec, 30.0)
        assert (started.name, started.active_state) == (name, "active")
        assert name in [u.name for u in units.list_units("ironclaw-contract-*.service")]
        units.stop(name, 30.0)
        after = [u for u in units.list_units("ironclaw-contract-*.service") if u.name == name]
        assert all(u.active_state in ("inactive", "failed") for u in after)
        units.reset_failed(name)
    finally:
        units.stop(name, 30.0)


@pytest.mark.parametrize("told", ["exit", "dies_at_start"])
def test_a_unit_that_ends_on_its_own_keeps_its_result_until_reset(
    host_impl: str, told: str
) -> None:
    """The real unit runs /bin/false: its start succeeds (the program was executed) and it
    fails at once. The fake's unit ends when told to, after its start (``exit``) or by it
    (``dies_at_start``, which unit tests use for a sandbox whose runsc fails at start)."""
    units = _units(host_impl)
    name = f"ironclaw-contract-{secrets.token_hex(4)}.service"
    spec = UnitSpec(name=name, argv=["/bin/false"], description="contract", netns_path=None,
                    collect_mode="inactive")  # fmt: skip
    try:
        if isinstance(units, FakeUnits) and told == "dies_at_start":
            units.dies_at_start[name] = "exit-code"
        units.start_transient(spec, 30.0)
        if isinstance(units, FakeUnits) and told == "exit":
            units.exit(name, "exit-code")
        state = units.wait_inactive(name, 30.0)
        assert state is not None
        assert (state.name, state.active_state, state.result) == (name, "failed", "exit-code")
        assert name in [u.name for u in units.list_units("ironclaw-contract-*.service")]
        units.reset_failed(name)
        assert name not in [u.name for u in units.list_units("ironclaw-contract-*.service")]
    finally:
        units.stop(name, 30.0)


def test_waiting_for_a_unit_that_keeps_running_fails_naming_it(host_impl: str) -> None:
    units = _units(host_impl)
    name = f"ironclaw-contract-{secrets.token_hex(4)}.service"
    assert units.wait_inactive(name, 1.0) is None  # never started: gone
    spec = UnitSpec(name=name, argv=["/bin/sleep", "300"], description="contract",
                    netns_path=None, collect_mode="inactive")  # fmt: skip
    try:
        units.start_transient(spec, 30.0)
        with pytest.raises(HostError, match=f"waiting for unit {name}: still active after 0.5s"):
            units.wait_inactive(name, 0.5)
    finally:
        units.stop(name, 30.0)


def test_netns_create_verify_list_delete(host_impl: str) -> None:
    netns = _netns(host_impl)
    name = f"ironclaw-contract-{secrets.token_hex(4)}"
    try:
        path = netns.create(name)
        assert path.name == name
        assert netns.verify(name) == path
        assert name in netns.list_names("ironclaw-contract-")
    finally:
        netns.delete(name)
    assert name not in netns.list_names("ironclaw-contract-")
    try:
        netns.verify(name)
    except HostError:
        pass
    else:
        raise AssertionError(f"verify of deleted netns {name} did not fail")
