"""Unpacking a package: real ``dpkg-deb`` on .debs the tests build (tests/support/debs.py), the
helper side (ironclawd/host/pkg_unpack.py) and the daemon side (ironclawd/bundle/layer.py).

Every hostile package is a valid .deb (real ``dpkg-deb --info``/``--fsys-tarfile`` read it), so
each refusal here comes from our checks: the helper refuses it naming the member and why, and
the daemon refuses the same data again when it is fed the raw tar directly (as if the helper had
been subverted), writing nothing outside its staging directory. Needs root (the extractor makes
root-owned files) and dpkg-deb; no systemd: the helper's unit is the lead's integration test.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from ironclawd.bundle.layer import extract_layer
from ironclawd.errors import HostError, PolicyDenied
from ironclawd.host import pkg_unpack
from ironclawd.host.pkg_unpack import unpack
from tests.support import debs

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the extractor chowns to root)"),
    pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (package dpkg)"),
]


# ---------------------------------------------------------------- the test packages are real


def test_every_test_package_is_a_deb_dpkg_reads(tmp_path: Path) -> None:
    built = [debs.benign(tmp_path), debs.benign(tmp_path, "gz"), debs.with_postinst(tmp_path)]
    built += [debs.shadowing(tmp_path)] + [h.build(tmp_path) for h in debs.HOSTILE.values()]
    for deb in built:
        info = subprocess.run(["dpkg-deb", "--info", str(deb)], capture_output=True, check=False)
        assert info.returncode == 0, (deb.name, info.stderr)
        assert debs.raw_data_tar(deb)[:512].strip(b"\0"), deb.name


# ---------------------------------------------------------------- helper side


@pytest.mark.parametrize("name", sorted(debs.HOSTILE))
def test_the_helper_refuses_each_hostile_package_naming_member_and_reason(
    name: str, tmp_path: Path
) -> None:
    hostile = debs.HOSTILE[name]
    out = io.BytesIO()
    with pytest.raises(PolicyDenied) as caught:
        unpack(hostile.build(tmp_path), out)
    message = str(caught.value)
    assert repr(hostile.member) in message
    assert hostile.reason in message
    assert out.getvalue() == b"", "a refused package must leave no partial layer"


@pytest.mark.parametrize("compression", ["xz", "gz"])
def test_the_benign_package_becomes_exactly_its_clean_layer(
    compression: debs.Compression, tmp_path: Path
) -> None:
    data = debs.helper_output(debs.benign(tmp_path, compression))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        members = tar.getmembers()
        contents = {m.name: tar.extractfile(m).read() for m in members if m.isreg()}  # type: ignore[union-attr]
    got = {m.name: (m.type, m.mode, m.linkname) for m in members}
    assert got == debs.BENIGN_LAYER
    for m in members:
        assert (m.uid, m.gid, m.uname, m.gname, m.mtime) == (0, 0, "root", "root", 0), m.name
        assert not m.pax_headers or set(m.pax_headers) <= {"path", "linkpath"}, m.pax_headers
    assert contents == {
        "usr/bin/hello": debs.HELLO,
        "usr/share/doc/hello/copyright": debs.COPYRIGHT,
    }


def test_maintainer_scripts_never_reach_the_layer_nor_run(tmp_path: Path) -> None:
    deb = debs.with_postinst(tmp_path)
    listing = subprocess.run(
        ["dpkg-deb", "--info", str(deb)], capture_output=True, text=True, check=True
    ).stdout
    assert "postinst" in listing  # the control: the package really carries one
    data = debs.helper_output(deb)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        assert sorted(tar.getnames()) == ["usr", "usr/bin", "usr/bin/hello"]
    assert debs.POSTINST.encode() not in data
    assert not Path("/tmp/ironclaw-postinst-ran").exists()


def test_extended_attributes_and_file_capabilities_are_dropped(tmp_path: Path) -> None:
    deb = debs.with_capability(tmp_path)
    with tarfile.open(fileobj=io.BytesIO(debs.raw_data_tar(deb)), mode="r:") as tar:
        carried = tar.getmember("./usr/bin/hello").pax_headers
    assert "SCHILY.xattr.security.capability" in carried  # the package really carries one
    with tarfile.open(fileobj=io.BytesIO(debs.helper_output(deb)), mode="r:") as tar:
        assert {m.name: m.pax_headers for m in tar.getmembers()} == {
            "usr": {},
            "usr/bin": {},
            "usr/bin/hello": {},
        }


def test_a_dotdot_path_writes_nothing_outside(tmp_path: Path) -> None:
    escaped = Path("/tmp/ironclaw-escaped")
    assert not escaped.exists()
    deb = debs.HOSTILE["dotdot"].build(tmp_path)
    with pytest.raises(PolicyDenied, match=r"'\.\.'"):
        debs.helper_output(deb)
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(PolicyDenied, match=r"'\.\.'"):
        extract_layer(debs.raw_data_tar(deb), staging, tmp_path / "no-base")
    assert not escaped.exists()
    assert list(staging.iterdir()) == []


def test_something_dpkg_deb_cannot_read_fails_with_its_words(tmp_path: Path) -> None:
    not_a_deb = tmp_path / "not.deb"
    not_a_deb.write_bytes(b"!<arch>\nthis is no package\n")
    out = io.BytesIO()
    with pytest.raises(HostError, match=r"not\.deb: dpkg-deb --fsys-tarfile exited 2: .*dpkg-deb"):
        unpack(not_a_deb, out)
    assert out.getvalue() == b""


def test_a_data_member_that_is_no_tar_is_refused(tmp_path: Path) -> None:
    deb = debs.not_a_tar(tmp_path)
    assert debs.raw_data_tar(deb).startswith(b"this is not a tar")  # dpkg-deb is content with it
    with pytest.raises(PolicyDenied, match=r"data\.tar is not a tar archive we read"):
        debs.helper_output(deb)


def test_the_helper_bounds_members_and_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deb = debs.benign(tmp_path)
    monkeypatch.setattr(pkg_unpack, "MAX_LAYER_MEMBERS", 3)
    with pytest.raises(PolicyDenied, match="more than 3 members"):
        debs.helper_output(deb)
    monkeypatch.setattr(pkg_unpack, "MAX_LAYER_MEMBERS", 100)
    monkeypatch.setattr(pkg_unpack, "MAX_LAYER_BYTES", len(debs.HELLO) + 1)
    with pytest.raises(PolicyDenied, match=f"more than {len(debs.HELLO) + 1} bytes"):
        debs.helper_output(deb)


def test_a_member_below_a_symlink_of_its_own_package_is_refused(tmp_path: Path) -> None:
    members = [
        *debs.dirs_of("usr/lib/x"),
        debs.entry("usr/lib/x", tarfile.SYMTYPE, mode=0o777, link="../share"),
        debs.entry("usr/lib/x/evil", data=b"through the link\n"),
    ]
    deb = debs.build_deb(tmp_path / "below-link.deb", members)
    with pytest.raises(PolicyDenied, match="below the symlink usr/lib/x"):
        debs.helper_output(deb)
