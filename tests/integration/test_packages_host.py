"""The real package adapter (bundle/packages.py) against real apt, the real Debian archive this
machine reaches, dpkg-deb and hardened helper units in a private systemd: the contract the fake
keeps (tests/contract/package_contract.py), then the jq image file by file. Without the archive
the resolve step fails, and so does this test: it never passes silently (docs/development.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.test_gateway import out, sh

pytestmark = pytest.mark.integration


def test_the_real_adapter_keeps_the_contract_and_builds_a_clean_jq_image(daemon: Any) -> None:
    proc = sh(daemon, "ls -d /var/lib/ironclaw/rootfs/*/ | grep -v unavailable | head -1")
    base = proc.stdout.decode().strip().rstrip("/")
    assert proc.returncode == 0, out(proc)
    assert base, out(proc)
    work = sh(daemon, "mktemp -d /var/lib/ironclaw/pkg-test-XXXXXX").stdout.decode().strip()
    try:
        proc = daemon.run(
            [".venv/bin/python", "-m", "tests.integration.pkg_driver", base, work], timeout=900
        )
        assert proc.returncode == 0, out(proc)
        report: dict[str, Any] = json.loads(proc.stdout.decode().splitlines()[-1])
    finally:
        sh(daemon, f"rm -rf {work}")
    seconds = report["contract_seconds"], report["build_seconds"]
    print(f"\ncontract {seconds[0]:.1f} s; jq image {seconds[1]:.1f} s")
    added = report["inspect"]["added"]
    assert "usr/bin/jq" in added, added
    assert any(p.startswith("usr/lib/x86_64-linux-gnu/libjq.so") for p in added), added
    assert any(p.startswith("usr/lib/x86_64-linux-gnu/libonig.so") for p in added), added
    assert "etc/ironclaw/programs.json" in added
    # jq loads libm: beside the base's libc even if the agent itself never needed it.
    assert report["libm"] is True
    assert report["inspect"]["shell_or_interpreter"] == []
    assert report["inspect"]["setid"] == []
    assert report["inspect"]["not_root"] == []
    assert report["inspect"]["writable"] == []
    assert report["base_unchanged"] is True
    assert report["units_left"] == ""
    assert report["collected"] is True
