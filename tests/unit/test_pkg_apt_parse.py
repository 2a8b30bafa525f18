"""The readers of apt's output in ironclawd/host/pkg_apt.py, on text apt 2.6 printed on this
machine; tests/integration/test_packages_apt.py runs them against the real apt."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ironclawd.host.pkg_apt import (
    INST_RE,
    SELECTING_RE,
    AptError,
    _apt_failure,
    _check_plan,
    download,
    relation_names,
    resolve,
    stanzas,
)

SHOW = """\
Package: jq
Version: 1.6-2.1+deb12u3
Maintainer: ChangZhuo Chen (陳昌倬) <czchen@debian.org>
Architecture: amd64
Depends: libjq1 (= 1.6-2.1+deb12u3), libc6 (>= 2.34)
Description: lightweight and flexible command-line JSON processor
 jq is like sed for JSON data
 .
 more: text
Priority: optional
Size: 64432
SHA256: c25f3fda201207ed98b1d63686f2d81b9dfeb99f1ab2d1d35fb3f7b6a1c107dc

Package: base-files
Essential: yes
Pre-Depends: awk
Provides: base
"""


def test_stanzas_keep_fields_and_join_continuations() -> None:
    jq, base = stanzas(SHOW)
    assert jq["Depends"] == "libjq1 (= 1.6-2.1+deb12u3), libc6 (>= 2.34)"
    assert jq["Description"].splitlines()[1:] == ["jq is like sed for JSON data", ".", "more: text"]
    assert "more" not in jq  # a continuation line is never a field
    assert jq["SHA256"].startswith("c25f3f")
    assert base == {"Package": "base-files", "Essential": "yes", "Pre-Depends": "awk",
                    "Provides": "base"}  # fmt: skip


def test_relation_names_flatten_alternatives_and_drop_versions_and_qualifiers() -> None:
    assert relation_names("libjq1 (= 1.6-2.1+deb12u3), libc6 (>= 2.34)") == ["libjq1", "libc6"]
    assert relation_names("python3 (<< 3.12), python3 (>= 3.11~), python3:any, libc6") == [
        "python3",
        "libc6",
    ]
    assert relation_names("default-mta | mail-transport-agent, a [amd64] <!nocheck>") == [
        "default-mta",
        "mail-transport-agent",
        "a",
    ]
    assert relation_names("") == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "Inst libonig5 (6.9.8-1 Debian:12.15/oldstable [amd64])",
            ("libonig5", None, "6.9.8-1", "amd64"),
        ),
        (
            "Inst libjq1 (1.6-2.1+deb12u3 Debian-Security:12/oldstable-security [amd64])",
            ("libjq1", None, "1.6-2.1+deb12u3", "amd64"),
        ),
        (
            "Inst busybox-static (1:1.35.0-4+deb12u1+b1 Debian:12.15/oldstable [amd64]) []",
            ("busybox-static", None, "1:1.35.0-4+deb12u1+b1", "amd64"),
        ),
        (
            "Inst libc6 [2.36-9+deb12u10] (2.36-9+deb12u14 Debian:12.15/oldstable [amd64])",
            ("libc6", "2.36-9+deb12u10", "2.36-9+deb12u14", "amd64"),
        ),
        (
            "Inst tzdata:all (2025b-0+deb12u1 Debian:12.15/oldstable, Debian:12/x [all])",
            ("tzdata", None, "2025b-0+deb12u1", "all"),
        ),
    ],
)
def test_install_lines(line: str, expected: tuple[str, str | None, str, str]) -> None:
    m = INST_RE.match(line)
    assert m is not None
    assert (m["name"], m["old"], m["version"], m["arch"]) == expected


def _proc(stderr: str, code: int = 100) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["apt-get"], code, "", stderr)


def test_apt_errors_are_rephrased_for_the_operator() -> None:
    unknown = _apt_failure("x", _proc("E: Unable to locate package nosuch\n"))
    assert str(unknown) == "package nosuch: not in the host's configured archives"
    virtual = _apt_failure("x", _proc("E: Package 'awk' has no installation candidate\n"))
    assert str(virtual).startswith("package awk: no installable version in the host's archives")
    other = _proc("W: ignored\nE: Unable to correct problems, you have held broken packages.\n")
    assert str(_apt_failure("apt-get could not resolve a", other)) == (
        "apt-get could not resolve a: Unable to correct problems, you have held broken packages."
    )
    assert str(_apt_failure("apt-get", _proc("", 1))) == "apt-get: exit 1"


def test_a_requested_name_apt_read_as_a_pattern_or_a_virtual_is_refused() -> None:
    plan = [("libjq1", "1", "amd64"), ("libjq-dev", "1", "amd64")]
    with pytest.raises(AptError, match=r"package libjq\.: apt adds no package of exactly this"):
        _check_plan(["libjq."], plan, "")
    note = "Note, selecting 'mawk' instead of 'awk'\n"
    assert SELECTING_RE.search(note) is not None
    with pytest.raises(AptError, match="package awk: apt would select mawk instead"):
        _check_plan(["awk"], [("mawk", "1", "amd64")], note)
    _check_plan(["libjq1"], plan, "")


def test_names_and_versions_are_checked_before_apt_sees_them(tmp_path: Path) -> None:
    with pytest.raises(AptError, match="not a Debian package name"):
        resolve(["-oAPT::Get::AllowUnauthenticated=1"], "", tmp_path)
    with pytest.raises(AptError, match="is not a Debian version"):
        download("jq", "1.6 --allow-unauthenticated", tmp_path)
    assert resolve([], "", tmp_path) == []
