"""The contract every ``PackageImages`` keeps (ports/__init__.py), as one function: the fake
(tests/contract/test_packages.py) and the real adapter over apt, dpkg-deb and systemd units
(tests/integration/pkg_driver.py, run inside the private systemd) are both held to it."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from ironclawd.errors import InvalidArgument, PolicyDenied, SignatureMismatch
from ironclawd.ports import PackageImages

UNKNOWN = "ironclaw-no-such-package"


def check_contract(images: PackageImages) -> dict[str, object]:
    """Run every clause against ``images``; return what was seen (for the driver's report)."""
    jq = images.resolve(["jq"])
    names = {p.name for p in jq}
    assert {"jq", "libjq1", "libonig5"} <= names, names
    assert "libc6" not in names  # the base holds it: apt was told so
    assert [p.name for p in jq if p.requested] == ["jq"]
    assert all(re.fullmatch(r"[0-9a-f]{64}", p.sha256) and p.size > 0 for p in jq)
    # Refused with the package that pulled it in named; unknown names are the submitter's error.
    with pytest.raises(PolicyDenied, match=r"python3.*python3-yaml|python3-yaml.*python3"):
        images.resolve(["python3-yaml"])
    with pytest.raises(PolicyDenied, match="bash"):
        images.resolve(["bash"])
    with pytest.raises(InvalidArgument, match=UNKNOWN):
        images.resolve([UNKNOWN])

    assert images.image(()) == images.base
    image = images.image(jq)
    programs = json.loads((image / "etc/ironclaw/programs.json").read_text())["programs"]
    assert programs["jq"] == "/usr/bin/jq", programs
    assert images.image(jq) == image  # content-addressed: built once

    # The archive now serves other bytes for an approved version: refused, nothing unpacked.
    forged = tuple(
        dataclasses.replace(p, sha256="0" * 64) if p.name == "libonig5" else p for p in jq
    )
    before = sorted(e.name for e in image.parent.iterdir())
    with pytest.raises(SignatureMismatch, match="libonig5"):
        images.image(forged)
    assert sorted(e.name for e in image.parent.iterdir()) == before

    assert images.collect([jq], []) == []
    assert images.collect([], [str(image)]) == []  # a session's bundle still names it
    removed = images.collect([], [])
    assert image.name in removed
    assert not image.exists()
    assert images.base.is_dir()
    return {"resolved": [dataclasses.asdict(p) for p in jq], "programs": programs}
