"""Contract tests: one behaviour per port, run against its fake (tests/fakes) and its real
adapter, so a fake cannot drift from what it stands in for.

Adapters that only need files (SQLCipher records, credentials, mount sources, clocks) run for
real here, against a tmp dir. Adapters that need root and a systemd of their own (units, netns)
run for real only with ``--real-host``: tests/integration/test_contracts_real.py runs this
directory that way inside the private systemd; without it those parameters are not generated
(never skipped)."""

from __future__ import annotations

from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--real-host", action="store_true",
        help="also run the contracts against adapters that need root and a private systemd "
        "(only inside one: tests/integration/test_contracts_real.py)",
    )  # fmt: skip


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``host_impl`` is "fake", plus "real" under --real-host."""
    if "host_impl" in metafunc.fixturenames:
        impls: list[Any] = ["fake"]
        if metafunc.config.getoption("--real-host", default=False):
            impls.append(pytest.param("real", marks=pytest.mark.real_host))
        metafunc.parametrize("host_impl", impls)
