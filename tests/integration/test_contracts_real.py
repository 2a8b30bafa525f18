"""The contract tests of the ports whose real adapters need root and a systemd of their own
(tests/contract/test_host.py: UnitManager over pystemd, NetnsManager over pyroute2), run inside
the private systemd with ``--real-host``: the real adapters must do what their fakes do."""

from __future__ import annotations

import re
from typing import Any

import pytest

pytestmark = pytest.mark.integration

REAL_HOST_CONTRACTS = 2  # the tests of tests/contract/test_host.py, each once for real


def test_real_host_adapters_pass_the_contracts_of_their_fakes(private_systemd: Any) -> None:
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
