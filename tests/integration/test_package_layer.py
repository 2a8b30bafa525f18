"""The daemon side of unpacking (ironclawd/bundle/layer.py): a layer tar into an image tree.

The extractor trusts nothing the helper wrote: it is fed here the helper's real output for the
benign package, and also raw ``dpkg-deb --fsys-tarfile`` data of each hostile test package and
hand-made tars (as if the helper had been subverted). It refuses each again, refuses shadowing
the base image and two packages writing one file, and never writes outside its staging
directory. Needs root (it makes root-owned files) and dpkg-deb.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import stat
import tarfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from ironclawd.bundle import layer
from ironclawd.bundle.layer import extract_layer
from ironclawd.errors import PolicyDenied
from tests.support import debs

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the extractor chowns to root)"),
    pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (package dpkg)"),
]


def make_tar(members: Sequence[debs.Member]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    return buffer.getvalue()


def tree(root: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every path below ``root`` -> (mode, uid, gid, symlink target), symlinks not followed."""
    found: dict[str, tuple[int, int, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            info = path.lstat()
            target = os.readlink(path) if path.is_symlink() else ""
            found[str(path.relative_to(root))] = (info.st_mode, info.st_uid, info.st_gid, target)
    return found


class Image:
    """A staging tree being built beside a base image, and everything else in tmp_path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.staging, self.base = root / "staging", root / "base"
        self.outside = root / "outside"
        self.staging.mkdir()
        self.outside.mkdir()
        (self.base / "usr/bin").mkdir(parents=True)
        (self.base / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
        (self.base / "usr/lib/x86_64-linux-gnu/libc.so.6").write_bytes(b"the base's libc\n")
        (self.base / "usr/lib64").symlink_to("lib")

    def extract(self, data: bytes) -> list[str]:
        return extract_layer(data, self.staging, self.base)

    def everything_but_staging(self) -> dict[str, tuple[int, int, int, str]]:
        return {k: v for k, v in tree(self.root).items() if not k.startswith("staging")}


@pytest.fixture
def image(tmp_path: Path) -> Image:
    return Image(tmp_path)


def test_the_benign_layer_lands_root_owned_read_only(image: Image, tmp_path: Path) -> None:
    data = debs.helper_output(debs.benign(tmp_path))
    before = image.everything_but_staging()
    written = image.extract(data)
    assert written == list(debs.BENIGN_LAYER)
    got = tree(image.staging)
    assert set(got) == set(debs.BENIGN_LAYER)
    for path, (kind, _mode, link) in debs.BENIGN_LAYER.items():
        mode, uid, gid, target = got[path]
        assert (uid, gid, target) == (0, 0, link), path
        if kind == tarfile.DIRTYPE:
            assert mode == stat.S_IFDIR | 0o755, path
        elif kind == tarfile.SYMTYPE:
            assert stat.S_ISLNK(mode), path
        else:
            expected = 0o555 if path == "usr/bin/hello" else 0o444
            assert mode == stat.S_IFREG | expected, (path, oct(mode))
    assert (image.staging / "usr/bin/hello").read_bytes() == debs.HELLO
    assert image.everything_but_staging() == before


@pytest.mark.parametrize("name", sorted(debs.HOSTILE))
def test_each_hostile_package_is_refused_again_without_the_helper(
    name: str, image: Image, tmp_path: Path
) -> None:
    hostile = debs.HOSTILE[name]
    raw = debs.raw_data_tar(hostile.build(tmp_path))
    before = image.everything_but_staging()
    with pytest.raises(PolicyDenied) as caught:
        image.extract(raw)
    assert repr(hostile.member) in str(caught.value)
    assert hostile.reason in str(caught.value)
    assert image.everything_but_staging() == before
    # Members before the refused one may have landed (the caller deletes staging), it never.
    refused = hostile.member.removeprefix("./")
    assert refused.startswith("/") or not os.path.lexists(image.staging / refused)


def test_no_extended_attribute_or_file_capability_lands(image: Image, tmp_path: Path) -> None:
    # The raw data, bypassing the helper (which drops pax headers): the extractor writes file
    # contents and its own owner and mode, nothing else of the header.
    image.extract(debs.raw_data_tar(debs.with_capability(tmp_path)))
    hello = image.staging / "usr/bin/hello"
    assert hello.read_bytes() == debs.HELLO
    assert os.listxattr(hello, follow_symlinks=False) == []


@pytest.mark.parametrize(
    ("path", "words"),
    [
        (debs.SHADOWING_PATH, "would shadow /usr/lib/x86_64-linux-gnu/libc.so.6 of the base"),
        ("usr/lib64/libfoo.so", "would shadow /usr/lib64 of the base image (a symlink)"),
        ("usr/bin", "would shadow /usr/bin of the base image (a directory)"),
    ],
)
def test_a_package_cannot_shadow_the_base(
    path: str, words: str, image: Image, tmp_path: Path
) -> None:
    base_before = tree(image.base)
    data = debs.helper_output(debs.shadowing(tmp_path, path))  # the helper cannot know the base
    with pytest.raises(PolicyDenied, match=re.escape(words)):
        image.extract(data)
    assert tree(image.base) == base_before
    assert not (image.staging / path).exists()


def test_a_directory_may_join_a_directory_of_the_base(image: Image, tmp_path: Path) -> None:
    written = image.extract(debs.helper_output(debs.benign(tmp_path)))
    assert "usr/bin" in written  # the base has usr/bin as a real directory: no shadowing


def test_two_packages_one_file_is_refused(image: Image, tmp_path: Path) -> None:
    data = debs.helper_output(debs.benign(tmp_path))
    image.extract(data)
    with pytest.raises(PolicyDenied, match="'usr/bin/hello': already in the image"):
        image.extract(data)
    assert (image.staging / "usr/bin/hello").read_bytes() == debs.HELLO


def test_a_file_where_an_earlier_package_made_a_directory_is_refused(image: Image) -> None:
    image.extract(make_tar([debs.directory("usr/share/x")]))
    with pytest.raises(PolicyDenied, match="'usr/share/x': already in the image"):
        image.extract(make_tar([debs.entry("usr/share/x", data=b"file\n")]))
    with pytest.raises(PolicyDenied, match="its parent usr/share/x/y is already in the image"):
        image.extract(
            make_tar([debs.entry("usr/share/x/y", data=b"f"), debs.entry("usr/share/x/y/z")])
        )


# Where the interpreter has tarfile's data filter (3.11.4 and later) it refuses a member that a
# planted symlink leads out of staging first; Debian 12's 3.11.2, the package's (and the dev
# venv's) interpreter, has none, and the layer's own check of the image refuses it.
if hasattr(tarfile, "data_filter"):
    THROUGH_A_LINK = {
        "usr/share/doc": "outside the destination",
        "usr/hello": "outside the destination",
    }
else:
    THROUGH_A_LINK = {
        "usr/share/doc": "'usr/share/doc': its parent usr/share is already in the image as a "
        "symlink",
        "usr/hello": "'usr/hello': already in the image",
    }


def test_a_planted_symlink_in_staging_is_never_followed(image: Image) -> None:
    (image.staging / "usr").mkdir()
    (image.staging / "usr/share").symlink_to(image.outside)
    (image.staging / "usr/hello").symlink_to(image.outside / "hello")
    (image.staging / "usr/lib").mkdir()
    (image.staging / "usr/lib2").symlink_to("lib")  # inside staging: tarfile's filter passes it
    before = image.everything_but_staging()
    with pytest.raises(PolicyDenied, match=re.escape(THROUGH_A_LINK["usr/share/doc"])):
        image.extract(make_tar([debs.entry("usr/share/doc", data=b"x")]))
    with pytest.raises(PolicyDenied, match="its parent usr/lib2 is already in the image"):
        image.extract(make_tar([debs.entry("usr/lib2/libx.so", data=b"x")]))
    assert not (image.staging / "usr/lib/libx.so").exists()
    with pytest.raises(PolicyDenied, match=re.escape(THROUGH_A_LINK["usr/hello"])):
        image.extract(make_tar([debs.entry("usr/hello", data=b"x")]))
    (image.staging / "usr/hello2").symlink_to("lib/hello")
    with pytest.raises(PolicyDenied, match="'usr/hello2': already in the image"):
        image.extract(make_tar([debs.entry("usr/hello2", data=b"x")]))
    assert not (image.staging / "usr/lib/hello").exists()
    assert image.everything_but_staging() == before
    assert not (image.outside / "hello").exists()


def test_members_through_a_symlink_of_the_same_layer_are_refused(image: Image) -> None:
    hostile = make_tar(
        [
            debs.entry("usr/lib/x", tarfile.SYMTYPE, mode=0o777, link="../share"),
            debs.entry("usr/lib/x/evil", data=b"through the link\n"),
        ]
    )
    with pytest.raises(PolicyDenied, match="its parent usr/lib/x is already in the image"):
        image.extract(hostile)
    assert not (image.staging / "usr/share").exists()


def test_one_file_twice_in_one_layer_is_refused(image: Image) -> None:
    twice = [debs.entry("usr/bin/a", data=b"1"), debs.entry("usr/bin/a", data=b"2")]
    with pytest.raises(PolicyDenied, match="'usr/bin/a': already in the image"):
        image.extract(make_tar(twice))
    assert (image.staging / "usr/bin/a").read_bytes() == b"1"


def test_a_truncated_or_compressed_or_garbled_tar_is_refused(image: Image, tmp_path: Path) -> None:
    data = debs.helper_output(debs.benign(tmp_path))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        cut = tar.getmembers()[3].offset  # a header boundary: tarfile alone would accept it
    with pytest.raises(PolicyDenied, match="truncated"):
        image.extract(data[:cut])
    garbled = data[:cut] + b"\xff" * 512 + data[cut + 512 :]
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with pytest.raises(PolicyDenied, match="truncated"):
        extract_layer(garbled, fresh, image.base)
    compressed = io.BytesIO()
    with tarfile.open(fileobj=compressed, mode="w:gz") as tar:
        tar.addfile(tarfile.TarInfo("usr/x"), io.BytesIO(b""))
    with pytest.raises(PolicyDenied, match="not a tar archive we read"):
        image.extract(compressed.getvalue())


def test_the_extractor_bounds_members_and_bytes(
    image: Image, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layer, "MAX_LAYER_MEMBERS", 2)
    three = [debs.entry("a1", data=b"1"), debs.entry("a2", data=b"2"), debs.entry("a3")]
    with pytest.raises(PolicyDenied, match="more than 2 members"):
        image.extract(make_tar(three))
    monkeypatch.setattr(layer, "MAX_LAYER_MEMBERS", 100)
    monkeypatch.setattr(layer, "MAX_LAYER_BYTES", 10)
    with pytest.raises(PolicyDenied, match="10 bytes"):
        image.extract(make_tar([debs.entry("big", data=b"x" * 11)]))
