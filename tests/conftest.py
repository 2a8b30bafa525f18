"""Root conftest: makes ``tests.*`` importable and loads the shared systemd fixtures once.

``pytest_plugins`` is only honoured in a top-level conftest, so it lives here rather than in
tests/integration or tests/redteam (tests/harness/fixtures.py says why it must be one plugin).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytest_plugins = ("tests.harness.fixtures",)
