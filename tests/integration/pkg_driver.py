"""Runs inside the private systemd (as root, like ironclawd): the real ``AptPackageImages`` (apt
and dpkg-deb in hardened helper units, the real Debian archive) held to the same contract as the
fake (tests/contract/package_contract.py), then the jq image inspected file by file. Prints one
JSON document for tests/integration/test_packages_host.py.

    python -m tests.integration.pkg_driver BASE_ROOTFS WORKDIR
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ironclawd.bundle.image import content_digest
from ironclawd.bundle.packages import AptPackageImages
from ironclawd.host.pkg_runner import HelperRunner
from tests.contract.package_contract import check_contract
from tests.integration.test_rootfs import INTERPRETER_NAME, SHELL_NAME

LIB_DIRS = ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu")


def _inspect(image: Path, base: Path) -> dict[str, Any]:
    files, setid, not_root, writable, named = [], [], [], [], []
    for path in sorted(image.rglob("*")):
        info = path.lstat()
        rel = str(path.relative_to(image))
        # The rootfs test's names (tests/integration/test_rootfs.py), over every file of the image.
        by_name = SHELL_NAME.fullmatch(path.name) or INTERPRETER_NAME.fullmatch(path.name)
        if by_name and not stat.S_ISDIR(info.st_mode):
            named.append(rel)
        if not (base / rel).exists() and not stat.S_ISDIR(info.st_mode):
            files.append(rel)
        if info.st_mode & (stat.S_ISUID | stat.S_ISGID):
            setid.append(rel)
        if info.st_uid != 0 or info.st_gid != 0:
            not_root.append(rel)
        if not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o222:
            writable.append(rel)
    return {"added": files, "setid": setid, "not_root": not_root, "writable": writable,
            "shell_or_interpreter": named}  # fmt: skip


def _units_left() -> str:
    argv = ["systemctl", "list-units", "--all", "--plain", "--no-legend", "ironclaw-pkg-*"]
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()


def main() -> None:
    base, work = Path(sys.argv[1]), Path(sys.argv[2])
    before = content_digest(base)
    images = AptPackageImages(base, work / "images", HelperRunner())
    started = time.monotonic()
    seen = check_contract(images)
    contract_seconds = time.monotonic() - started
    resolved = images.resolve(["jq"])
    started = time.monotonic()
    image = images.image(resolved)
    build_seconds = time.monotonic() - started
    report = {
        **seen,
        "contract_seconds": contract_seconds,
        "build_seconds": build_seconds,
        "image": str(image),
        "inspect": _inspect(image, base),
        "base_unchanged": content_digest(base) == before,
        "libm": any((image / d / "libm.so.6").exists() for d in LIB_DIRS),
        "units_left": _units_left(),
    }
    images.collect([], [])
    report["collected"] = not image.exists()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
