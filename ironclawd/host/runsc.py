"""What the installed runsc offers, and the argv that runs a sandbox with it
(docs/architecture.md §3).

runsc's flags differ between releases (Debian 12 ships 20221219 with ptrace and kvm; Debian 13
ships 20240729, which adds systrap), so they are detected, never assumed. Parsing and argv
building are pure functions; only ``detect``, ``delete_state`` and ``list_containers`` run runsc.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ironclawd import lazy_re, paths
from ironclawd.errors import ConfigError, HostError, InvalidArgument
from ironclawd.filecache import IdentityCache, file_identity

RUNSC = paths.RUNSC
KNOWN_PLATFORMS = ("systrap", "ptrace", "kvm")
# kvm is never picked by "auto": on these hosts it hung at 100% CPU although /dev/kvm exists.
AUTO_ORDER = ("systrap", "ptrace")
_CONTAINER_ID_RE = lazy_re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_TIMEOUT = 30.0

Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]


@dataclass(frozen=True)
class RunscInfo:
    """The facts about one runsc binary that decide how it is invoked."""

    path: Path
    version: str  # e.g. "0.0~20221219.0" (Debian) or "release-20240729.0" (upstream)
    release_date: int | None  # e.g. 20221219, when the version carries one
    platforms: tuple[str, ...]
    flags: frozenset[str]  # top-level flag names, without the dash

    @property
    def host_uds(self) -> bool:
        """Whether ``--host-uds=`` (connect to host Unix sockets) is understood."""
        return "host-uds" in self.flags


@dataclass(frozen=True)
class RunscContainer:
    id: str
    pid: int
    status: str  # created, running, stopped
    bundle: str


def parse_version(text: str) -> tuple[str, int | None]:
    """``runsc --version`` output -> (version, release date as YYYYMMDD or None)."""
    m = re.search(r"^runsc version (\S+)", text, re.MULTILINE)
    if m is None:
        raise HostError(f"reading runsc version: unexpected output {text[:80]!r}")
    date = re.search(r"(?<!\d)(20\d{6})(?!\d)", m.group(1))
    return m.group(1), int(date.group(1)) if date else None


def parse_flags(text: str) -> frozenset[str]:
    """``runsc flags`` output -> the set of top-level flag names."""
    return frozenset(re.findall(r"^\s{1,4}-([A-Za-z0-9][A-Za-z0-9_-]*)", text, re.MULTILINE))


def parse_platforms_help(text: str) -> tuple[str, ...]:
    """``runsc help platforms`` output (one name per line) -> platform names."""
    words = [line.strip() for line in text.splitlines()]
    return tuple(w for w in words if re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", w))


def parse_platform_flag(text: str) -> tuple[str, ...]:
    """Fallback: the platforms named in ``runsc flags``' ``-platform`` help line."""
    m = re.search(r"^\s*-platform string\s*\n\s*(.*)$", text, re.MULTILINE)
    if m is None:
        return ()
    return tuple(p for p in KNOWN_PLATFORMS if re.search(rf"\b{p}\b", m.group(1)))


def choose_platform(configured: str, info: RunscInfo) -> str:
    """The platform to run with: ``auto`` is systrap if offered, else ptrace; never kvm."""
    if configured == "auto":
        for name in AUTO_ORDER:
            if name in info.platforms:
                return name
        raise HostError(
            f"choosing runsc platform: runsc {info.version} offers {list(info.platforms)}, "
            f"none of {list(AUTO_ORDER)}"
        )
    if configured not in info.platforms:
        raise ConfigError(
            f"runsc platform {configured!r}: runsc {info.version} offers {list(info.platforms)}"
        )
    return configured


def filesystem_flags(info: RunscInfo) -> list[str]:
    """Flags that keep every runsc on the file-access model of Debian 12's (20221219).

    Newer runsc (Debian 13's 20240729) defaults to ``--directfs``: the sandbox (the sentry)
    opens the container's files itself, and runs as root in a user namespace mapping all of
    the host's ids, with CAP_DAC_OVERRIDE and friends (which also needs CAP_SETFCAP in its unit,
    to map root). With ``--directfs=false`` the gofer alone touches host files and the sandbox
    runs as uid 65534 with no capabilities, as on 20221219 (docs/development.md, runsc).
    """
    return ["--directfs=false"] if "directfs" in info.flags else []


def choose_working_platform(
    configured: str, info: RunscInfo, trial: Callable[[str], str | None]
) -> tuple[str, str]:
    """(platform, why): like ``choose_platform``, but ``auto`` takes a platform preferred over
    ptrace only if ``trial(name)`` (a trivial sandbox on it) returns None, not a reason it
    failed. The last candidate is taken untried: with nothing left, doctor says why it fails.
    """
    if configured != "auto":
        return choose_platform(configured, info), "configured"
    offered = [name for name in AUTO_ORDER if name in info.platforms]
    if not offered:
        choose_platform(configured, info)  # raises, naming what runsc offers
    skipped = []
    for name in offered[:-1]:
        reason = trial(name)
        if reason is None:
            return name, f"auto: {name} offered and a trial sandbox ran on it"
        skipped.append(f"{name} failed its trial: {reason}")
    why = "; ".join(skipped) or f"runsc {info.version} offers no {AUTO_ORDER[0]}"
    return offered[-1], f"auto: {offered[-1]} ({why})"


def check_container_id(container_id: str) -> str:
    """``container_id`` if runsc would take it as one path component of its state, else
    InvalidArgument naming it."""
    if not _CONTAINER_ID_RE.fullmatch(container_id):
        raise InvalidArgument(f"container id {container_id!r}: expected [A-Za-z0-9_.-], <= 128")
    return container_id


def runsc_argv(
    info: RunscInfo,
    *,
    root: Path,
    bundle: Path,
    container_id: str,
    platform: str,
    host_uds: bool,
) -> list[str]:
    """argv of ``runsc run`` for one sandbox; ``--network=none`` always.

    ``host_uds`` allows connecting (never creating) host Unix sockets; the caller asks for it
    only because the one socket directory mounted in is the session's own.

    ``--ignore-cgroups`` keeps the gofer and sandbox in the cgroup runsc was started in: the
    transient unit's, whose limits systemd enforces and whose processes systemd stops. Without
    it runsc moves them to ``/<container id>`` at the root of every cgroup hierarchy: outside
    the unit (a SIGKILL of the unit left them running) and outside ironclaw.slice.
    """
    if platform not in info.platforms:
        raise HostError(f"building runsc argv: platform {platform!r} not offered by runsc")
    if not root.is_absolute() or not bundle.is_absolute():
        raise InvalidArgument("building runsc argv: root and bundle must be absolute paths")
    if "ignore-cgroups" not in info.flags:
        raise HostError(f"building runsc argv: runsc {info.version} lacks --ignore-cgroups")
    argv = [
        str(info.path),
        f"--root={root}",
        "--network=none",
        f"--platform={platform}",
        "--ignore-cgroups",
        *filesystem_flags(info),
    ]
    if host_uds:
        if not info.host_uds:
            raise HostError(f"building runsc argv: runsc {info.version} lacks --host-uds")
        argv.append("--host-uds=open")
    return [*argv, "run", "--bundle", str(bundle), check_container_id(container_id)]


def parse_list_json(text: str) -> list[RunscContainer]:
    """``runsc list -format=json`` output (``null`` when there are none) -> containers."""
    try:
        rows: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HostError(f"listing runsc containers: bad JSON: {exc}") from exc
    out = []
    for row in rows or []:
        out.append(
            RunscContainer(
                id=str(row["id"]),
                pid=int(row.get("pid") or 0),
                status=str(row.get("status", "")),
                bundle=str(row.get("bundle", "")),
            )
        )
    return out


def _run(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)


def _call(what: str, argv: Sequence[str], run: Runner, *, stderr: bool = False) -> str:
    """Run runsc; its output (``stderr=True``: stdout and stderr, for Go's flag help)."""
    try:
        proc = run(argv, _TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HostError(f"{what}: {exc}") from exc
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        raise HostError(f"{what}: runsc exited {proc.returncode}: {detail[0]}")
    return proc.stdout + proc.stderr if stderr else proc.stdout


def detect(path: Path = RUNSC, run: Runner = _run) -> RunscInfo:
    """Ask the runsc at ``path`` for its version, top-level flags and platforms."""
    version, date = parse_version(_call("reading runsc version", [str(path), "--version"], run))
    # Go's flag package prints the flag list on stderr.
    flags_text = _call("reading runsc flags", [str(path), "flags"], run, stderr=True)
    try:
        platforms = parse_platforms_help(
            _call("reading runsc platforms", [str(path), "help", "platforms"], run)
        )
    except HostError:
        platforms = ()
    return RunscInfo(
        path=path,
        version=version,
        release_date=date,
        platforms=platforms or parse_platform_flag(flags_text),
        flags=parse_flags(flags_text),
    )


DETECT_KIND = "runsc-detect"
TRIAL_KIND = "runsc-platform-trial"


def detect_cached(cache: IdentityCache, path: Path = RUNSC, run: Runner = _run) -> RunscInfo:
    """``detect(path)``, remembered in ``cache`` while the binary at ``path`` keeps its file
    identity (a package upgrade replaces it: new inode and times)."""
    try:
        key = file_identity(path)
    except OSError as exc:
        raise HostError(f"reading runsc at {path}: {exc}") from exc
    info = _info_from_json(path, cache.get(DETECT_KIND, key))
    if info is None:
        info = detect(path, run)
        cache.put(DETECT_KIND, key, _info_to_json(info))
    return info


def cached_trial(
    cache: IdentityCache, info: RunscInfo, trial: Callable[[str], str | None]
) -> Callable[[str], str | None]:
    """``trial`` (a platform's trial sandbox), whose successes are remembered for this runsc
    binary on this kernel. A failure is tried again at the next start: it may have been the
    load of the moment, and a wrong "fails" would keep the slower platform for good."""

    def run(platform: str) -> str | None:
        try:
            key = f"{file_identity(info.path)}\0{platform}\0{os.uname().release}"
        except OSError:
            return trial(platform)
        if cache.get(TRIAL_KIND, key) == "ran":
            return None
        reason = trial(platform)
        if reason is None:
            cache.put(TRIAL_KIND, key, "ran")
        return reason

    return run


def _info_to_json(info: RunscInfo) -> dict[str, Any]:
    return {
        "version": info.version,
        "release_date": info.release_date,
        "platforms": list(info.platforms),
        "flags": sorted(info.flags),
    }


def _info_from_json(path: Path, value: Any) -> RunscInfo | None:
    """A cached entry back into RunscInfo; None for anything not of the shape written."""
    if not isinstance(value, dict):
        return None
    version, date = value.get("version"), value.get("release_date")
    platforms, flags = value.get("platforms"), value.get("flags")
    if not (
        isinstance(version, str)
        and (date is None or isinstance(date, int))
        and isinstance(platforms, list)
        and all(isinstance(p, str) for p in platforms)
        and isinstance(flags, list)
        and all(isinstance(f, str) for f in flags)
    ):
        return None
    return RunscInfo(path, version, date, tuple(platforms), frozenset(flags))


def delete_state(root: Path, container_id: str, path: Path = RUNSC, run: Runner = _run) -> None:
    """Kill and forget a container's runsc state; a container that is not there is fine.

    runsc is started only when ``root`` holds something of the container: a ``runsc delete``
    with nothing to delete still costs a start of runsc (~26 ms here), and a removal after a
    stop, or a removal that stops first, tears down twice (issue 17)."""
    argv = [str(path), f"--root={root}", "delete", "-force", check_container_id(container_id)]
    if state_files(root, container_id) == []:
        return
    _call(f"deleting runsc container {container_id}", argv, run)


def state_files(root: Path, container_id: str) -> list[Path] | None:
    """What ``root`` holds of the container: runsc 20221219 and 20240729 keep
    ``<id>_sandbox:<id>.state`` and ``.lock`` there; any entry named ``<id>``, ``<id>.*`` or
    ``<id>_*`` counts, whatever the version. ``[]`` when the root has none or does not exist;
    None when it cannot be read (then only runsc can tell)."""
    check_container_id(container_id)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    except OSError:
        return None
    own = (f"{container_id}.", f"{container_id}_")
    return sorted(root / n for n in names if n == container_id or n.startswith(own))


def list_containers(root: Path, path: Path = RUNSC, run: Runner = _run) -> list[RunscContainer]:
    """The containers runsc has state for under ``root`` (for reconcile)."""
    argv = [str(path), f"--root={root}", "list", "-format=json"]
    return parse_list_json(_call(f"listing runsc containers in {root}", argv, run))
