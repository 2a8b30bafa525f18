"""Debian packages for agents (docs/packages.md): ``ports.PackageImages`` over apt and dpkg.

- **Resolve** (at submission): apt, in an unprivileged unit with no network, is asked what
  installing the names would add to a system holding only the base image's packages (a fake
  dpkg status made from the packages that own the base's host libraries). The policy refusals
  are the domain's (domain/packages.py).
- **Image** (at apply, and at a session start that finds it missing): every ``.deb`` downloaded
  by apt in an unprivileged unit, its size and SHA-256 compared with the approved ones, all
  before any is unpacked; each unpacked in its own unit; the image assembled
  (bundle/package_image.py) under an exclusive lock.
- **Collect**: images no agent and no session bundle names are removed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

from ironclawd.bundle.package_image import assemble_image, image_digest
from ironclawd.domain.packages import AgentPackage, candidate_from_mapping, check_resolved
from ironclawd.errors import InvalidArgument, SandboxError, SignatureMismatch

log = logging.getLogger("ironclawd.packages")

LIB_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/lib", "/usr/lib")
MAX_RESOLVED = 256


class Steps(Protocol):
    """Runs one helper step (host/pkg_runner.py HelperRunner)."""

    def run(self, step: str, args: Sequence[str], stdin: bytes = b"", *,
            network: bool = False) -> bytes: ...  # fmt: skip


class AptPackageImages:
    """``ports.PackageImages`` with real apt, dpkg-deb and systemd units."""

    def __init__(self, base: Path, images_dir: Path, steps: Steps) -> None:
        self._base = base
        self._images = images_dir
        self._steps = steps
        self._base_packages: list[dict[str, str]] | None = None

    @property
    def base(self) -> Path:
        return self._base

    def resolve(self, names: Sequence[str]) -> tuple[AgentPackage, ...]:
        if not names:
            return ()
        status = self._status_text().encode()
        raw = self._steps.run("resolve", list(names), status)
        try:
            found = json.loads(raw)
        except ValueError as exc:
            raise SandboxError(
                f"resolving {', '.join(names)}: the helper's answer: {exc}"
            ) from None
        if not isinstance(found, list) or len(found) > MAX_RESOLVED:
            raise SandboxError(f"resolving {', '.join(names)}: expected a list of packages")
        try:
            candidates = [
                candidate_from_mapping(item, f"resolved[{i}]") for i, item in enumerate(found)
            ]
        except InvalidArgument as exc:  # the helper's answer, not the submitter's input
            raise SandboxError(f"resolving {', '.join(names)}: {exc}") from None
        return check_resolved(tuple(names), candidates)

    def image(self, packages: Sequence[AgentPackage]) -> Path:
        if not packages:
            return self._base
        dest = self._images / image_digest(self._base, packages)
        if dest.is_dir():
            return dest
        self._images.mkdir(mode=0o700, parents=True, exist_ok=True)
        with _locked(self._images / ".lock"):
            if dest.is_dir():
                return dest
            ordered = sorted(packages, key=lambda p: p.name)
            debs = self._download(ordered)
            layers = [(p.name, self._steps.run("unpack", [], deb)) for p, deb in zip(
                ordered, debs, strict=True)]  # fmt: skip
            assemble_image(self._base, layers, self._host_libraries(), dest)
        log.info("built image %s for %s", dest.name,
                 ", ".join(f"{p.name} {p.version}" for p in packages))  # fmt: skip
        return dest

    def collect(self, keep: Iterable[Sequence[AgentPackage]], in_use: Iterable[str]) -> list[str]:
        """Remove every image neither an agent's packages (``keep``) nor a session's bundle
        (``in_use``: image paths) names; also builds a crash left half done."""
        if not self._images.is_dir() or not any(e.name != ".lock" for e in self._images.iterdir()):
            return []  # nothing to collect: ``in_use`` (every bundle read) is not consumed
        wanted = {image_digest(self._base, p) for p in keep if p}
        wanted |= {Path(p).name for p in in_use}
        removed = []
        with _locked(self._images / ".lock"):
            for entry in sorted(self._images.iterdir()):
                if entry.name == ".lock" or entry.name in wanted:
                    continue
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
        return removed

    def _download(self, packages: Sequence[AgentPackage]) -> list[bytes]:
        """Every approved ``.deb`` by one apt run, each checked against its approved size and
        hash; SignatureMismatch naming the first that differs (nothing is unpacked then)."""
        asked = [f"{p.name}={p.version}" for p in packages]
        raw = self._steps.run("download", asked, network=True)
        header, _, body = raw.partition(b"\n")
        sizes = _sizes(header, len(packages))
        if sizes is None:
            raise SandboxError(f"downloading {', '.join(asked)}: the helper's answer is malformed")
        if sum(sizes) != len(body):
            raise SandboxError(f"downloading {', '.join(asked)}: sizes do not add up")
        debs, offset = [], 0
        for package, size in zip(packages, sizes, strict=True):
            deb = body[offset : offset + size]
            offset += size
            digest = hashlib.sha256(deb).hexdigest()
            if len(deb) != package.size or digest != package.sha256:
                raise SignatureMismatch(
                    f"package {package.name} {package.version}: the .deb apt fetched has sha256 "
                    f"{digest} ({len(deb)} bytes), not the approved {package.sha256} "
                    f"({package.size} bytes); nothing was unpacked (submit the change again)"
                )
            debs.append(deb)
        return debs

    def _base_package_list(self) -> list[dict[str, str]]:
        """The host packages owning the base image's host libraries, with their versions."""
        if self._base_packages is None:
            owners: set[str] = set()
            files = [f"/{p.relative_to(self._base)}" for p in _base_libraries(self._base)]
            if files:
                # Exit 1 when some file is no package's (then it adds nothing to the status).
                owners = owners_of(_host(["dpkg", "-S", *files], ok=(0, 1)))
            fields = "${Package}\t${Version}\t${Architecture}\t${Multi-Arch}\n"
            rows = _host(["dpkg-query", "-W", f"-f={fields}", *sorted(owners)]) if owners else ""
            packages = []
            for row in rows.splitlines():
                name, version, arch, multi = ([*row.split("\t"), "", "", "", ""])[:4]
                packages.append({"name": name, "version": version, "arch": arch, "multi": multi})
            self._base_packages = packages
        return self._base_packages

    def _status_text(self) -> str:
        stanzas = []
        for p in self._base_package_list():
            lines = [f"Package: {p['name']}", "Status: install ok installed",
                     f"Version: {p['version']}", f"Architecture: {p['arch']}"]  # fmt: skip
            if p["multi"]:
                lines.append(f"Multi-Arch: {p['multi']}")
            stanzas.append("\n".join(lines) + "\n")
        return "\n".join(stanzas)

    def _host_libraries(self) -> list[Path]:
        """The shared libraries of the base's packages (libm of libc6, say) that a package's
        program may load; the base holds only those the agent itself loads."""
        names = [p["name"] for p in self._base_package_list()]
        if not names:
            return []
        found = []
        for line in _host(["dpkg", "-L", *names]).splitlines():
            path = Path(line.strip())
            if str(path.parent) in LIB_DIRS and ".so" in path.name and not path.is_symlink():
                found.append(path)
        return sorted(set(found))


def _sizes(header: bytes, count: int) -> list[int] | None:
    """The download helper's header line: ``count`` sizes, or None if it is anything else."""
    try:
        sizes = json.loads(header)["sizes"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(sizes, list) or len(sizes) != count:
        return None
    if not all(isinstance(n, int) and n >= 0 for n in sizes):
        return None
    return sizes


def bundle_roots(bundles_dir: Path) -> Iterator[str]:
    """The image of every session bundle on disk (running or adoptable sessions): its root.
    Lazy: each bundle's config is read only when ``collect`` has an image to decide on (~0.1 ms
    a session, of every start)."""
    for bundle in sorted(bundles_dir.iterdir()) if bundles_dir.is_dir() else []:
        try:
            spec = json.loads((bundle / "config.json").read_text())
            root = str(spec["root"]["path"])
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Unreadable: it might name any image, so none may go.
            raise SandboxError(f"bundle {bundle.name}: unreadable: {exc}") from None
        yield root


def _base_libraries(base: Path) -> list[Path]:
    out = []
    for top in ("lib", "lib64", "usr/lib"):
        root = base / top
        if root.is_dir():
            out += [p for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()]
    return out


def owners_of(dpkg_s: str) -> set[str]:
    """The package names in ``dpkg -S FILE...`` output ("libc6:amd64, libfoo: /path" a line).

    Lines about diversions are not owners: Debian 13's libc6 diverts /lib64/ld-linux-x86-64.so.2
    (usrmerge), and ``dpkg -S`` prints "diversion by libc6 from: /lib64/..." before the owner.
    """
    owners: set[str] = set()
    for line in dpkg_s.splitlines():
        names, _, _path = line.partition(": ")
        if names.startswith("diversion by "):
            continue
        owners.update(n.strip().split(":")[0] for n in names.split(","))
    return owners


def _host(argv: list[str], ok: tuple[int, ...] = (0,)) -> str:
    """A dpkg query on the host's own database (no input from a package)."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env={
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"})  # fmt: skip
    if done.returncode not in ok:
        raise SandboxError(f"{' '.join(argv[:2])}: {done.stderr.strip()[-500:]}")
    return done.stdout


class _locked:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd = -1

    def __enter__(self) -> None:
        self._fd = os.open(self._path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)
