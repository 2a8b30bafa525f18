"""Under CI (or IRONCLAW_REQUIRE_REAL=1) the integration, red-team and e2e tiers fail instead of
skipping when root, systemd or runsc is missing (tests/harness/fixtures.py), so a run cannot pass
on the unit tier alone. Each case runs pytest (in this process: the unit tier starts no
subprocess) over a small tree of tests that use the real fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness.fixtures import OPTED_OUT

pytest_plugins = ("pytester",)

NEEDS_SYSTEMD = """
def test_boots(private_systemd):
    raise AssertionError("booted a systemd: the prerequisites were not missing")
"""


@pytest.fixture
def tree(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A checkout-like tree whose conftest loads the real tiers' plugin; no CI variables."""
    for name in ("CI", "IRONCLAW_REQUIRE_REAL", "IRONCLAW_USE_HOST_SYSTEMD"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest('pytest_plugins = ("tests.harness.fixtures",)')
    for tier in ("unit", "integration", "redteam", "e2e"):
        (pytester.path / "tests" / tier).mkdir(parents=True)
    return pytester


def write(tree: pytest.Pytester, path: str, source: str) -> None:
    (tree.path / path).write_text(source)


def not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)


def no_runsc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "bin-without-runsc"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


@pytest.mark.parametrize("env", [("CI", "true"), ("IRONCLAW_REQUIRE_REAL", "1")])
def test_without_root_every_real_tier_fails_under_ci(
    tree: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, env: tuple[str, str]
) -> None:
    for tier in ("integration", "redteam", "e2e"):
        write(tree, f"tests/{tier}/test_{tier}.py", NEEDS_SYSTEMD)
    not_root(monkeypatch)
    monkeypatch.setenv(*env)
    result = tree.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=3)
    for tier in ("integration", "redteam", "e2e"):
        result.stdout.fnmatch_lines([f"*the {tier} tier may not skip under CI*needs root*"])


def test_without_runsc_the_integration_tier_fails_under_ci(
    tree: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    write(tree, "tests/integration/test_x.py", NEEDS_SYSTEMD)
    no_runsc(monkeypatch, tmp_path)
    monkeypatch.setenv("CI", "1")
    result = tree.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*may not skip under CI*needs runsc*"])


def test_outside_ci_the_same_tests_skip_saying_why(
    tree: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The control: the failures above come from CI, not from a broken fixture."""
    write(tree, "tests/integration/test_x.py", NEEDS_SYSTEMD)
    not_root(monkeypatch)
    result = tree.runpytest_inprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs root*"])
    no_runsc(monkeypatch, tmp_path)
    result = tree.runpytest_inprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs runsc*"])


def test_any_skip_of_a_real_tier_fails_under_ci_but_an_opt_out_or_xfail_does_not(
    tree: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        tree,
        "tests/integration/test_x.py",
        f"""
import pytest

def test_forced():
    pytest.skip("minisign missing")

@pytest.mark.skipif(True, reason="no netns here")
def test_marked():
    pass

def test_opted_out():
    pytest.skip({OPTED_OUT!r} + "IRONCLAW_E2E=0")

@pytest.mark.xfail(strict=True, reason="a documented gap")
def test_known_gap():
    raise AssertionError("still open")
""",
    )
    write(
        tree,
        "tests/unit/test_y.py",
        """
import pytest

def test_unit_skip():
    pytest.skip("the unit tier is not the real thing")
""",
    )
    monkeypatch.setenv("CI", "1")
    result = tree.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, errors=1, skipped=2, xfailed=1)
    result.stdout.fnmatch_lines(["*may not skip under CI*minisign missing*"])
    result.stdout.fnmatch_lines(["*may not skip under CI*no netns here*"])


def test_ci_false_is_not_ci(tree: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tree, "tests/integration/test_x.py", NEEDS_SYSTEMD)
    not_root(monkeypatch)
    monkeypatch.setenv("CI", "false")
    tree.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(skipped=1)


SKIPPED_AT_COLLECTION = {
    "tests/integration/test_module_skip.py": """
import pytest

pytest.skip("no netns support here", allow_module_level=True)

def test_never_reached():
    pass
""",
    "tests/redteam/test_import_skip.py": """
import pytest

pytest.importorskip("ironclaw_no_such_module_anywhere")

def test_never_reached():
    pass
""",
    "tests/e2e/conftest.py": """
import pytest

pytest.skip("no Debian image to boot", allow_module_level=True)
""",
    "tests/e2e/test_z.py": """
def test_never_reached():
    pass
""",
}


def test_a_real_tier_that_skips_while_collected_fails_under_ci(
    tree: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module-level skip, an importorskip or a skipping conftest of a real tier reach no
    test at all: collection itself must fail under CI."""
    for path, source in SKIPPED_AT_COLLECTION.items():
        write(tree, path, source)
    write(
        tree,
        "tests/integration/test_opted_out.py",
        f"""
import pytest

pytest.skip({OPTED_OUT!r} + "IRONCLAW_E2E=0", allow_module_level=True)
""",
    )
    write(
        tree,
        "tests/unit/test_y.py",
        """
import pytest

pytest.skip("the unit tier is not the real thing", allow_module_level=True)
""",
    )
    monkeypatch.setenv("CI", "1")
    result = tree.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=3, skipped=2)
    assert result.ret != 0
    result.stdout.fnmatch_lines_random(
        [
            "*test_module_skip.py: the integration tier may not skip under CI*no netns support*",
            "*test_import_skip.py: the redteam tier may not skip under CI*could not import*",
            "*tests/e2e: the e2e tier may not skip under CI*no Debian image to boot*",
        ]
    )
    # The control: outside CI the same tree only skips.
    monkeypatch.delenv("CI")
    result = tree.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(skipped=5)
