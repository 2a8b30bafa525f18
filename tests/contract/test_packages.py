"""``PackageImages``: the fake keeps the contract the real adapter keeps (the real one is held
to the same function inside the private systemd: tests/integration/test_packages_host.py)."""

from __future__ import annotations

from pathlib import Path

from tests.contract.package_contract import check_contract
from tests.fakes.packages import FakePackageImages


def test_the_fake_keeps_the_package_images_contract(tmp_path: Path) -> None:
    check_contract(FakePackageImages(tmp_path / "images"))
