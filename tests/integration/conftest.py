"""The integration tier's fixtures (`private_systemd`, `private_systemd_factory`, `daemon`) live
in tests/harness/fixtures.py, loaded once for all tiers by tests/conftest.py; they are
re-exported here by name for code that imports them from this module."""

from __future__ import annotations

from tests.harness.fixtures import RESULTS, ROOT, harness_binds, missing_prerequisite

__all__ = ["RESULTS", "ROOT", "harness_binds", "missing_prerequisite"]
