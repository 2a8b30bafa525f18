"""The package helper's unit (host/pkg_runner.py): what systemd-run is asked for. Every step runs
as a dynamic user without capabilities on a read-only system, with the daemon's paths
inaccessible; only a download has a network; the helper runs Debian's isolated interpreter with
the source root on its path and nothing from the environment. (The units run for real in
tests/integration/test_packages_host.py.)"""

from __future__ import annotations

from pathlib import Path

import ironclawd
from ironclawd.host.pkg_runner import HELPER_PYTHON, HelperLimits, helper_argv, helper_properties

LIMITS = HelperLimits()


def test_every_step_is_a_dynamic_user_without_capabilities_on_a_read_only_system() -> None:
    for network in (False, True):
        props = helper_properties(LIMITS, network=network, hidden=("/srv/agent-files",))
        for wanted in ("DynamicUser=yes", "ProtectSystem=strict", "ProtectHome=yes",
                       "PrivateTmp=yes", "NoNewPrivileges=yes", "CapabilityBoundingSet=",
                       "RestrictSUIDSGID=yes", "InaccessiblePaths=-/var/lib/ironclaw",
                       "InaccessiblePaths=-/run/ironclaw", "InaccessiblePaths=-/etc/ironclaw",
                       "InaccessiblePaths=-/var/cache/ironclaw",
                       "InaccessiblePaths=-/srv/agent-files",
                       f"MemoryMax={LIMITS.memory_max_bytes}"):  # fmt: skip
            assert wanted in props, (network, wanted)


def test_only_a_download_has_a_network() -> None:
    offline = helper_properties(LIMITS, network=False)
    assert "PrivateNetwork=yes" in offline
    assert "RestrictAddressFamilies=AF_UNIX" in offline
    online = helper_properties(LIMITS, network=True)
    assert "PrivateNetwork=yes" not in online
    assert not any(p.startswith("IPAddressDeny") for p in online)


def test_the_helper_is_debians_isolated_python_with_the_source_root_on_its_path() -> None:
    unit, argv = helper_argv("unpack", [], LIMITS, network=False)
    assert unit.startswith("ironclaw-pkg-unpack-")
    assert unit.endswith(".service")
    command = argv[argv.index("--") + 1 :]
    assert command[:3] == [HELPER_PYTHON, "-I", "-B"]
    root = str(Path(ironclawd.__file__).resolve().parent.parent)
    assert repr(root) in command[4]
    assert command[5:] == ["unpack"]
    assert not any(a.startswith("--setenv=PYTHON") for a in argv)
    # Each run is its own unit: a name is never reused.
    assert helper_argv("unpack", [], LIMITS, network=False)[0] != unit
