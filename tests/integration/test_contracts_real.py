"""The contract tests of the ports whose real adapters need root and a systemd of their own
(tests/contract/test_host.py: UnitManager over pystemd, NetnsManager over pyroute2;
tests/contract/test_mcp.py: McpClients over hardened units and mcp-server-time;
tests/contract/test_control.py: ControlPlane, its agents in units of the sessions' names;
tests/contract/test_runtime.py: SandboxRuntime over runsc in a hardened unit;
tests/contract/test_mcp_launcher.py: McpLauncher, a server in a hardened unit;
tests/contract/test_session_keys.py: SessionData's keys and pool over real tmpfs mounts), run
inside the private systemd with ``--real-host``: the real adapters must do what their fakes do."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.harness.mcp_venv import mcp_venv

pytestmark = pytest.mark.integration

# The tests of tests/contract/test_host.py (5), test_mcp.py (2), test_control.py (10),
# test_runtime.py (6), test_mcp_launcher.py (4) and test_session_keys.py (5), each once for real.
REAL_HOST_CONTRACTS = 32


def test_real_host_adapters_pass_the_contracts_of_their_fakes(private_systemd: Any) -> None:
    mcp_venv()  # built on the host (network, cache under build/), then used inside
    proc = private_systemd.run(
        [".venv/bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/contract",
         "--real-host", "-m", "real_host"],
        timeout=300,
    )  # fmt: skip
    out = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 0, out
    summary = re.search(r"(\d+) passed", out)
    assert summary is not None, out
    assert int(summary.group(1)) == REAL_HOST_CONTRACTS, out
    assert "skipped" not in out, out
