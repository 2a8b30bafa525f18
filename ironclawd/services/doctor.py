"""``Doctor``: run every host check the daemon can see, concurrently, each with a time bound."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import secrets
import stat
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ironclawd.config import Config, load_config
from ironclawd.config_reload import restart_only
from ironclawd.domain.checks import CheckResult, Status, failed, passed
from ironclawd.errors import ConfigError, IronclawError
from ironclawd.ports import Clock, HostProbes, MountSpace, NetnsManager, UnitManager

CHECK_TIMEOUT = 30.0


class Doctor:
    def __init__(
        self,
        *,
        config_path: Path,
        config: Config,
        netns: NetnsManager | None,
        units: UnitManager,
        probes: HostProbes,
        clock: Clock,
        platform_in_use: Callable[[], str] | None = None,
        space: MountSpace | None = None,
    ) -> None:
        self._config_path = config_path
        self._config = config
        self._netns = netns
        self._units = units
        self._probes = probes
        self._clock = clock
        # The platform the daemon's sandboxes run on ("" when runsc is unusable); None: doctor
        # reports what it would choose from its own trials.
        self._platform_in_use = platform_in_use
        self._space = space  # None: a doctor without a daemon's namespace (no check)

    async def run(self) -> list[CheckResult]:
        runsc = self._config.sandbox.runsc
        found = await asyncio.to_thread(self._probes.runsc, runsc)
        version_check, platforms = found.result, list(found.platforms)
        jobs: list[tuple[str, Callable[[], CheckResult]]] = [
            ("config.file", self._check_config),
            ("admin.socket", self._check_admin_socket),
            ("systemd.dbus", self._probes.systemd),
            ("cgroup.layout", self._probes.cgroups),
            ("netns.create", self._check_netns),
            ("sqlcipher", self._probes.sqlcipher),
        ]
        if self._space is not None:
            jobs.append(("outbound.namespace", self._check_space))
        configured = self._config.sandbox.platform
        for platform in platforms:
            if platform == "kvm" and configured != "kvm":
                continue
            jobs.append((f"runsc.platform.{platform}", self._platform_check(runsc, platform)))
        results = [version_check, *await asyncio.gather(*(self._timed(n, f) for n, f in jobs))]
        if "kvm" in platforms and configured != "kvm":
            results.append(
                CheckResult(
                    "runsc.platform.kvm",
                    Status.SKIP,
                    "not tried: kvm hung at 100% CPU on hosts like this",
                    "set sandbox.platform = 'kvm' to try it",
                    required=False,
                )
            )
        results.append(self._summarize_platforms(results, platforms))
        return results

    def _summarize_platforms(self, results: list[CheckResult], offered: list[str]) -> CheckResult:
        working = [
            r.name.rsplit(".", 1)[-1]
            for r in results
            if r.name.startswith("runsc.platform.") and r.status is Status.PASS
        ]
        configured = self._config.sandbox.platform
        in_use = self._platform_in_use() if self._platform_in_use is not None else ""
        chosen = in_use or (
            configured
            if configured != "auto"
            else next((p for p in ("systrap", "ptrace") if p in working), "")
        )
        if chosen and chosen in working:
            # ("will use" is what tests/redteam/report.py reads.)
            detail = f"will use '{chosen}' ({'in use; ' if in_use else ''}working: "
            detail += f"{', '.join(working)})"
            # A faster platform runsc offers but the daemon does not use: say why.
            for r in results:
                if r.name == "runsc.platform.systrap" and chosen != "systrap":
                    detail += f"; systrap not used: {r.detail}"
            return passed("runsc.platform", detail)
        if in_use:
            return failed(
                "runsc.platform",
                f"the daemon uses '{in_use}', which failed its trial (working: "
                f"{', '.join(working) or 'none'})",
                "see the platform checks above; set sandbox.platform, then systemctl restart "
                "ironclawd",
            )
        return failed(
            "runsc.platform",
            f"no usable platform (offered: {', '.join(offered) or 'none'}; configured: "
            f"{configured})",
            "install a runsc that offers systrap or ptrace; check the platform checks above",
        )

    def _check_config(self) -> CheckResult:
        try:
            current = load_config(self._config_path)
        except ConfigError as exc:
            return failed(
                "config.file",
                f"{exc} (the daemon still runs the last good config)",
                "fix the file, then systemctl reload ironclawd",
            )
        exists = self._config_path.exists()
        detail = f"{self._config_path} is valid" if exists else "no config file: using defaults"
        if current != self._config:
            waiting = restart_only(self._config, current)
            if waiting:
                return CheckResult(
                    "config.file",
                    Status.WARN,
                    f"{detail}, but {', '.join(waiting)} differ from what runs",
                    "systemctl restart ironclawd (a reload does not apply them)",
                )
            return CheckResult(
                "config.file",
                Status.WARN,
                f"{detail}, but differs from the loaded config",
                "systemctl reload ironclawd",
            )
        return passed("config.file", detail)

    def loaded(self, config: Config) -> None:
        """The configuration that runs now, after a reload (daemon.py): what the file is
        compared with. Without it, every reload left the check warning for good (found by a
        review, stop 50)."""
        self._config = config

    def _check_admin_socket(self) -> CheckResult:
        path = self._config.admin.socket
        try:
            st = os.lstat(path)
            group = grp.getgrgid(st.st_gid).gr_name
        except (OSError, KeyError) as exc:
            return failed("admin.socket", f"{path}: {exc}", "systemctl restart ironclawd")
        mode = stat.S_IMODE(st.st_mode)
        detail = f"{path} serving, mode {mode:04o}, group {group}"
        if not stat.S_ISSOCK(st.st_mode) or mode & 0o007 or group != self._config.admin.group:
            return failed("admin.socket", detail, "systemctl restart ironclawd")
        return passed("admin.socket", detail)

    def _check_netns(self) -> CheckResult:
        if self._netns is None:
            return CheckResult("netns.create", Status.SKIP, "no netns manager wired", "")
        name = f"ironclaw-doctor-{secrets.token_hex(4)}"
        try:
            self._netns.create(name)
            self._netns.verify(name)
        except IronclawError as exc:
            return failed("netns.create", str(exc), "ironclawd needs CAP_SYS_ADMIN and /run/netns")
        finally:
            with contextlib.suppress(IronclawError):
                self._netns.delete(name)
        return passed("netns.create", "created an empty network namespace (only lo) and removed it")

    def _check_space(self) -> CheckResult:
        assert self._space is not None
        ok, detail = self._space.health()
        if ok:
            return passed("outbound.namespace", detail)
        return failed(
            "outbound.namespace",
            detail,
            "stop the running sessions (ironctl session stop SID), then restart ironclawd: the "
            "start pins a new namespace, and each session's next start rebuilds its outbound "
            "queue from the record",
        )

    def _platform_check(self, runsc: Path, platform: str) -> Callable[[], CheckResult]:
        return lambda: self._probes.platform(self._units, runsc, platform)

    async def _timed(self, name: str, fn: Callable[[], CheckResult]) -> CheckResult:
        started = self._clock.monotonic()
        try:
            result = await asyncio.wait_for(asyncio.to_thread(fn), CHECK_TIMEOUT)
        except TimeoutError:
            result = failed(name, f"did not finish in {CHECK_TIMEOUT:g}s", "see the journal")
        except Exception as exc:  # a probe bug must show up as a failed check, not kill Doctor
            result = failed(name, f"check crashed: {type(exc).__name__}: {exc}", "see the journal")
        return replace(result, duration_seconds=self._clock.monotonic() - started)
