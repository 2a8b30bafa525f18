"""A clean Debian root (debootstrap minbase + systemd + dbus) to boot a private systemd on.

The e2e tier installs the .deb into this tree, not into the host's root: it shows what a user
on a fresh Debian gets. One tree per suite (bookworm = Debian 12, trixie = Debian 13). The tree
is the *lower* layer of the harness's overlay, so it is only ever read while booted and can be
shared by concurrent runs; it is built once per day, suite, mirror and package list under
build/e2e/ (debootstrap took 40 s to 3 minutes, ~240-350 MB) and appears atomically.

After debootstrap the tree gets the host's apt sources for that suite (same mirror, suites incl.
updates and security; for a suite the host does not use, the host's lines of its own suite with
the suite name replaced) and one `apt-get update` in a chroot, so a test can
`apt-get install ./x.deb` without fetching ~10 MB of indices each run.

Usage as a program (from the repository root; prints the tree's path)::

    python -m tests.harness.debian_root [--suite bookworm|trixie]

Stdlib only.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "build" / "e2e"
SUITES = ("bookworm", "trixie")
DEFAULT_SUITE = "bookworm"  # the host's (Debian 12)
INCLUDE = ("systemd", "dbus")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
KEEP = 2  # trees kept (each ~240 MB): today's and the previous one
DEBOOTSTRAP_TIMEOUT = 900.0


class DebianRootError(RuntimeError):
    """The clean root could not be made; the message says which step failed."""


def missing_prerequisite() -> str | None:
    """Why a Debian root cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root for debootstrap"
    if shutil.which("debootstrap") is None:
        return "needs debootstrap (apt-get install debootstrap; scripts/install-deps)"
    if not Path("/usr/share/keyrings/debian-archive-keyring.gpg").exists():
        return "needs debian-archive-keyring to verify the mirror"
    return None


def host_sources(suite: str = DEFAULT_SUITE) -> tuple[str, list[str]]:
    """The mirror and the apt source lines of this host for `suite` (deb822 or one-line style).

    A suite the host has no lines for gets the host's lines of its own suite (the entries whose
    suite is `<codename>`, `<codename>-updates`, `<codename>-security`) with the codename
    replaced: the same mirrors, the same pockets. IRONCLAW_E2E_MIRROR overrides the mirror
    (security then comes from the same host's debian-security path).
    """
    _check_suite(suite)
    override = os.environ.get("IRONCLAW_E2E_MIRROR")
    entries: list[tuple[str, str]] = []  # (uri, suite)
    for path in sorted(Path("/etc/apt").glob("sources.list.d/*.sources")):
        for stanza in path.read_text().split("\n\n"):
            fields = {}
            for line in stanza.splitlines():
                key, _, value = line.partition(":")
                if not line.startswith("#") and value.strip():
                    fields[key.strip().lower()] = value.strip()
            for uri in fields.get("uris", "").split():
                entries += [(uri, s) for s in fields.get("suites", "").split()]
    for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt").glob("sources.list.d/*.list")]:
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                m = re.match(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", line)
                if m:
                    entries.append((m.group(1), m.group(2)))
    ours = [(u.rstrip("/"), s) for u, s in entries if s.split("-")[0] == suite]
    if not ours:
        host = _host_codename()
        ours = [
            (u.rstrip("/"), suite + s[len(host) :])
            for u, s in entries
            if host and s.split("-")[0] == host
        ]
    mirror = override or next((u for u, s in ours if s == suite), DEFAULT_MIRROR)
    if override:
        base = override.rstrip("/").rsplit("/", 1)[0]
        ours = [(override, suite), (override, f"{suite}-updates"), (f"{base}/debian-security",
                f"{suite}-security")]  # fmt: skip
    lines = sorted({f"deb {u} {s} main" for u, s in ours} | {f"deb {mirror} {suite} main"})
    return mirror, lines


def _host_codename() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            key, _, value = line.partition("=")
            if key == "VERSION_CODENAME":
                return value.strip().strip('"')
    return ""


def _check_suite(suite: str) -> None:
    if suite not in SUITES:
        raise DebianRootError(f"unknown suite {suite!r}: expected one of {', '.join(SUITES)}")


def cache_key(suite: str, mirror: str, sources: list[str], day: str) -> str:
    digest = hashlib.sha256("\0".join([suite, mirror, *sources, *INCLUDE, "minbase", day]).encode())
    return f"{suite}-{day}-{digest.hexdigest()[:12]}"


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(argv: list[str], step: str, timeout: float = DEBOOTSTRAP_TIMEOUT) -> None:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive",
           "LC_ALL": "C"}  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise DebianRootError(f"{step}: timed out after {timeout:.0f} s") from exc
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr).decode(errors="replace")[-3000:]
        raise DebianRootError(f"{step}: exit {proc.returncode}\n{out}")


def ensure_debian_root(suite: str = DEFAULT_SUITE, *, log: bool = True) -> Path:
    """Path of today's clean tree of `suite`, building it first if needed (~1-3 min)."""
    reason = missing_prerequisite()
    if reason is not None:
        raise DebianRootError(reason)
    mirror, sources = host_sources(suite)
    day = os.environ.get("IRONCLAW_E2E_ROOT_DAY") or datetime.date.today().isoformat()
    tree = CACHE / cache_key(suite, mirror, sources, day)
    with _lock():
        if (tree / "lib/systemd/systemd").exists():
            return tree
        tmp = tree.with_name(tree.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        started = time.monotonic()
        if log:
            print(f"debian_root: debootstrap {suite} from {mirror} into {tree}", file=sys.stderr)
        _run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}", suite,
             str(tmp), mirror],
            "debootstrap",
        )  # fmt: skip
        (tmp / "etc/apt/sources.list").write_text(
            "# Written by tests/harness/debian_root.py from the host's sources.\n"
            + "\n".join(sources)
            + "\n"
        )
        # Package lists in the tree itself: each test then installs without an update. chroot
        # without /proc is enough for apt-get update (no maintainer scripts run).
        _run(["chroot", str(tmp), "apt-get", "update", "-qq"], "apt-get update in the tree")
        # Empty, as in Debian's cloud images: each boot gets a transient machine-id (not one
        # shared by every run). "uninitialized" would make it a first boot, whose
        # systemd-firstboot.service fails without a terminal.
        (tmp / "etc/machine-id").write_text("")
        tmp.rename(tree)
        if log:
            print(
                f"debian_root: ready in {time.monotonic() - started:.0f} s: {tree}",
                file=sys.stderr,
            )
        _prune(suite, keep=tree)
    return tree


def _prune(suite: str, keep: Path) -> None:
    trees = [p for p in CACHE.glob(f"{suite}-*") if p.is_dir() and not p.name.endswith(".tmp")]
    trees.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for old in trees[KEEP:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.harness.debian_root",
        description="Print the path of today's clean Debian root, debootstrapping it if needed.",
    )
    parser.add_argument("--suite", choices=SUITES, default=DEFAULT_SUITE)
    args = parser.parse_args(argv)
    try:
        print(ensure_debian_root(args.suite))
    except DebianRootError as exc:
        print(f"debian_root: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
