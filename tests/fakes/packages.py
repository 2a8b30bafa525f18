"""``PackageImages`` over a dict archive (the real adapter asks apt and dpkg-deb in units:
bundle/packages.py). It resolves dependencies, applies the same domain policy, "downloads" the
archive's bytes and re-checks their hash, and builds images as directories holding
``etc/ironclaw/programs.json``; tests/contract/package_contract.py holds both to one contract."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ironclawd.bundle.package_image import image_digest
from ironclawd.domain.packages import AgentPackage, Candidate, check_resolved
from ironclawd.errors import InvalidArgument, SignatureMismatch


@dataclass
class FakeDeb:
    version: str
    depends: tuple[str, ...] = ()
    programs: tuple[str, ...] = ()
    essential: bool = False
    priority: str = "optional"
    content: bytes = b""

    def data(self, name: str) -> bytes:
        return self.content or f"{name} {self.version}".encode()


def sample_archive() -> dict[str, FakeDeb]:
    """A small archive shaped like Debian's: jq with its libraries, bash, python3."""
    return {
        "jq": FakeDeb("1.6-2.1", ("libjq1", "libc6"), ("jq",)),
        "libjq1": FakeDeb("1.6-2.1", ("libonig5", "libc6")),
        "libonig5": FakeDeb("6.9.8-1", ("libc6",)),
        "bash": FakeDeb("5.2.15-2", (), ("bash",), essential=True, priority="required"),
        "python3-yaml": FakeDeb("6.0-3", ("python3",)),
        "python3": FakeDeb("3.11.2-1", (), ("python3",)),
    }


@dataclass
class FakePackageImages:
    root: Path  # images are made below it
    archive: dict[str, FakeDeb] = field(default_factory=sample_archive)
    base_packages: frozenset[str] = frozenset({"libc6"})
    built: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._base = self.root / "base"
        self._base.mkdir(exist_ok=True)

    @property
    def base(self) -> Path:
        return self._base

    def resolve(self, names: Sequence[str]) -> tuple[AgentPackage, ...]:
        found: dict[str, Candidate] = {}
        todo = list(names)
        while todo:
            name = todo.pop()
            if name in found or name in self.base_packages:
                continue
            deb = self.archive.get(name)
            if deb is None:
                raise InvalidArgument(f"package {name}: not in the host's configured archives")
            data = deb.data(name)
            found[name] = Candidate(
                name=name, version=deb.version, architecture="amd64",
                sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                essential=deb.essential, priority=deb.priority, depends=deb.depends,
            )  # fmt: skip
            todo += deb.depends
        return check_resolved(tuple(names), list(found.values()))

    def image(self, packages: Sequence[AgentPackage]) -> Path:
        if not packages:
            return self._base
        dest = self.root / image_digest(self._base, packages)
        if dest.is_dir():
            return dest
        for p in packages:  # every .deb checked before anything is unpacked
            deb = self.archive.get(p.name)
            data = deb.data(p.name) if deb is not None and deb.version == p.version else b""
            if hashlib.sha256(data).hexdigest() != p.sha256 or len(data) != p.size:
                raise SignatureMismatch(
                    f"package {p.name} {p.version}: the .deb apt fetched is not the approved "
                    "one; nothing was unpacked"
                )
        programs = {
            prog: f"/usr/bin/{prog}" for p in packages for prog in self.archive[p.name].programs
        }
        (dest / "etc/ironclaw").mkdir(parents=True)
        (dest / "etc/ironclaw/programs.json").write_text(json.dumps({"programs": programs}))
        self.built.append(dest.name)
        return dest

    def collect(self, keep: Iterable[Sequence[AgentPackage]], in_use: Iterable[str]) -> list[str]:
        wanted = {image_digest(self._base, p) for p in keep if p} | {Path(p).name for p in in_use}
        removed = []
        for entry in sorted(self.root.iterdir()):
            if entry == self._base or entry.name in wanted:
                continue
            shutil.rmtree(entry)
            removed.append(entry.name)
        return removed
