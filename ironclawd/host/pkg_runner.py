"""Run one step of package handling (resolve, download, unpack) in its own unprivileged unit.

The daemon is root; apt's resolver, its downloads and the ``.deb``/tar parsing of ``dpkg-deb``
are large parsers fed from the network. Each step runs as ``python -m ironclawd.host.pkg_helper
STEP`` under ``systemd-run --pipe --wait`` in a transient unit with ``DynamicUser=yes``, no
capabilities, a read-only system, a private /tmp, the daemon's state and runtime directories
made inaccessible, and (except for a download) no network at all. Its input is stdin, its
result stdout, both bounded; a failure is its stderr tail. The daemon trusts nothing it returns:
the caller re-checks hashes and every unpacked member.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import ironclawd
from ironclawd import paths
from ironclawd.errors import InvalidArgument, SandboxError

SYSTEMD_RUN: Final = "/usr/bin/systemd-run"
SYSTEMCTL: Final = "/usr/bin/systemctl"
UNIT_PREFIX: Final = "ironclaw-pkg-"
# Debian's interpreter, isolated (-I: no environment, no user site, no current directory): the
# helper needs only the standard library and its own modules (pkg_helper, pkg_apt, pkg_unpack,
# formats/deb_layer, errors), and a dynamic user can run it wherever the daemon's venv lives.
HELPER_PYTHON: Final = "/usr/bin/python3"
HELPER_CODE: Final = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from ironclawd.host.pkg_helper import main; sys.exit(main(sys.argv[1:]))"
)
STDERR_TAIL: Final = 2000
# The helper exits 3 when its input is at fault (the message is then for the submitter).
REFUSED_EXIT: Final = 3
HIDDEN: Final = paths.PRIVATE_DIRS


@dataclass(frozen=True)
class HelperLimits:
    memory_max_bytes: int = 512 * 1024 * 1024
    tasks_max: int = 64
    timeout_seconds: float = 300.0
    max_output_bytes: int = 512 * 1024 * 1024


def helper_properties(
    limits: HelperLimits, *, network: bool, hidden: Sequence[str] = ()
) -> list[str]:
    """The unit's settings in ``systemd-run -p`` form; ``network`` only for a download."""
    props = [
        "Type=exec", "DynamicUser=yes", "ProtectSystem=strict", "ProtectHome=yes",
        "PrivateTmp=yes", "PrivateDevices=yes", "PrivateIPC=yes", "PrivateMounts=yes",
        "NoNewPrivileges=yes", "CapabilityBoundingSet=", "AmbientCapabilities=",
        "RestrictNamespaces=yes", "LockPersonality=yes", "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes", "ProtectClock=yes", "ProtectHostname=yes",
        "ProtectKernelTunables=yes", "ProtectKernelModules=yes", "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes", "ProtectProc=invisible", "ProcSubset=pid",
        "DevicePolicy=closed", "KeyringMode=private", "SystemCallArchitectures=native",
        "SystemCallFilter=@system-service", "SystemCallFilter=~@privileged",
        "SystemCallErrorNumber=EPERM", "UMask=0077", "RemoveIPC=yes", "LimitCORE=0",
        f"MemoryMax={limits.memory_max_bytes}", "MemorySwapMax=0",
        f"TasksMax={limits.tasks_max}", "KillMode=control-group", "TimeoutStopSec=5s",
        "WorkingDirectory=/tmp",
        *(f"InaccessiblePaths=-{p}" for p in (*HIDDEN, *hidden)),
    ]  # fmt: skip
    if network:
        props.append("RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK")
    else:
        props += ["RestrictAddressFamilies=AF_UNIX", "PrivateNetwork=yes", "IPAddressDeny=any"]
    return props


def helper_argv(step: str, args: Sequence[str], limits: HelperLimits, *, network: bool,
                hidden: Sequence[str] = ()) -> tuple[str, list[str]]:  # fmt: skip
    """The unit's name and the systemd-run command line that runs ``step`` in it."""
    unit = f"{UNIT_PREFIX}{step}-{secrets.token_hex(6)}.service"
    # The helper imports ironclawd from where this daemon does (a venv or a checkout).
    source_root = str(Path(ironclawd.__file__).resolve().parent.parent)
    argv = [
        SYSTEMD_RUN, "--pipe", "--quiet", "--wait", "--collect", f"--unit={unit}",
        f"--description=IronClaw package helper ({step})",
        "--setenv=LC_ALL=C.UTF-8",
        *(f"--property={p}" for p in helper_properties(limits, network=network, hidden=hidden)),
        "--", HELPER_PYTHON, "-I", "-B", "-c", HELPER_CODE.format(root=source_root), step, *args,
    ]  # fmt: skip
    return unit, argv


class HelperRunner:
    """Runs package steps in their units (``ports.PackageSteps``' real adapter)."""

    def __init__(self, limits: HelperLimits = HelperLimits(), hidden: Sequence[str] = ()) -> None:
        self._limits = limits
        self._hidden = tuple(hidden)

    def run(self, step: str, args: Sequence[str], stdin: bytes = b"", *,
            network: bool = False) -> bytes:  # fmt: skip
        """The step's stdout; SandboxError with its stderr tail if it failed or ran too long."""
        unit, argv = helper_argv(step, args, self._limits, network=network, hidden=self._hidden)
        try:
            done = subprocess.run(
                argv, input=stdin, capture_output=True, check=False,
                timeout=self._limits.timeout_seconds,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            subprocess.run([SYSTEMCTL, "stop", unit], capture_output=True, check=False)
            raise SandboxError(
                f"package helper {step}: no result in {self._limits.timeout_seconds:g} s; stopped"
            ) from None
        except OSError as exc:
            raise SandboxError(f"package helper {step}: cannot start systemd-run: {exc}") from exc
        if done.returncode != 0:
            tail = done.stderr.decode("utf-8", "replace").strip()[-STDERR_TAIL:]
            if done.returncode == REFUSED_EXIT:  # the input was wrong (an unknown package, say)
                raise InvalidArgument(tail or f"package helper {step}: input refused")
            raise SandboxError(
                f"package helper {step} failed (exit {done.returncode}): {tail or 'no message'}"
            )
        if len(done.stdout) > self._limits.max_output_bytes:
            raise SandboxError(
                f"package helper {step}: more than {self._limits.max_output_bytes} bytes of output"
            )
        return done.stdout
