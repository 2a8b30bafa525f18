"""Collecting unused package images (bundle/packages.py ``AptPackageImages.collect``) where the
contract (tests/contract/package_contract.py) does not look: a start with no image reads no
session's bundle, and a bundle that cannot be read keeps every image."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from ironclawd.bundle.packages import AptPackageImages, bundle_roots
from ironclawd.errors import SandboxError


class NoSteps:
    def run(self, step: str, args: Sequence[str], stdin: bytes = b"", *,
            network: bool = False) -> bytes:  # fmt: skip
        raise AssertionError(f"collect ran helper step {step}")


def never_read() -> Iterator[str]:
    raise AssertionError("the bundles were read")
    yield ""  # a generator, like bundle_roots


@pytest.mark.parametrize("made", [[], [".lock"]], ids=["no images dir", "only the lock"])
def test_with_no_image_no_bundle_is_read(tmp_path: Path, made: list[str]) -> None:
    images = tmp_path / "images"
    if made:
        images.mkdir()
        for name in made:
            (images / name).touch()
    packages = AptPackageImages(tmp_path / "base", images, NoSteps())
    assert packages.collect([], never_read()) == []


def test_an_unreadable_bundle_keeps_every_image(tmp_path: Path) -> None:
    images, bundles = tmp_path / "images", tmp_path / "bundles"
    (images / ("0" * 64)).mkdir(parents=True)
    (bundles / "s1").mkdir(parents=True)
    (bundles / "s1" / "config.json").write_text('{"root": {}}')
    packages = AptPackageImages(tmp_path / "base", images, NoSteps())
    with pytest.raises(SandboxError, match="bundle s1: unreadable"):
        packages.collect([], bundle_roots(bundles))
    assert [p.name for p in images.iterdir()] == ["0" * 64]


def test_bundle_roots_names_each_bundles_image(tmp_path: Path) -> None:
    bundles = tmp_path / "bundles"
    for sid, root in (("s1", "/img/a"), ("s2", "/img/b")):
        (bundles / sid).mkdir(parents=True)
        (bundles / sid / "config.json").write_text(f'{{"root": {{"path": "{root}"}}}}')
    (bundles / "s3").mkdir()  # no config yet: names nothing
    assert list(bundle_roots(bundles)) == ["/img/a", "/img/b"]
    assert list(bundle_roots(tmp_path / "absent")) == []
