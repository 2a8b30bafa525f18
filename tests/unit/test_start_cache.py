"""The start cache (issue 17): the agent image digest and runsc's answers are reused while the
files keep their identity, and computed again when it changes (no runsc is run: a recorder
answers for it)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ironclawd.bundle import image
from ironclawd.errors import HostError
from ironclawd.filecache import IdentityCache, file_identity
from ironclawd.host import runsc
from tests.unit.test_runsc_parse import FLAGS_2022, VERSION_2022, Recorder


def image_dirs(tmp_path: Path) -> tuple[Path, Path]:
    frozen, template = tmp_path / "agent", tmp_path / "template"
    (frozen / "_internal").mkdir(parents=True)
    (frozen / "agent").write_bytes(b"\x7fELF agent")
    (frozen / "_internal" / "libpython.so").write_bytes(b"lib" * 1000)
    (template / "etc").mkdir(parents=True)
    (template / "etc" / "passwd").write_text("agent:x:10000:10000::/:/nonexistent\n")
    return frozen, template


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, ...]]:
    calls: list[tuple[Path, ...]] = []
    real = image.content_digest

    def counting(*roots: Path) -> str:
        calls.append(roots)
        return real(*roots)

    monkeypatch.setattr(image, "content_digest", counting)
    return calls


def test_image_digest_is_hashed_once_while_files_keep_their_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frozen, template = image_dirs(tmp_path)
    cache = IdentityCache(tmp_path / "state" / "cache" / "start.json")
    hashed = count_reads(monkeypatch)
    first = image.cached_content_digest(cache, frozen, template)
    # A new daemon: a fresh object over the same file.
    again = image.cached_content_digest(
        IdentityCache(tmp_path / "state" / "cache" / "start.json"), frozen, template
    )
    assert first == again == image.content_digest(frozen, template)
    assert len(hashed) == 2  # the first start and the reference above, never the second start


# Not here: an in-place rewrite of the same size within one tick of the kernel's coarse clock
# keeps every time stat shows (no identity can see it); packages replace files (a new inode).
@pytest.mark.parametrize("change", ["replace", "add", "remove", "chmod", "touch"])
def test_any_change_of_the_image_hashes_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    frozen, template = image_dirs(tmp_path)
    cache = IdentityCache(tmp_path / "cache.json")
    before = image.cached_content_digest(cache, frozen, template)
    lib = frozen / "_internal" / "libpython.so"
    if change == "replace":
        (frozen / "new").write_bytes(b"lib" * 999 + b"LIB")
        (frozen / "new").rename(lib)
    elif change == "add":
        (frozen / "_internal" / "extra.so").write_bytes(b"x")
    elif change == "remove":
        (template / "etc" / "passwd").unlink()
    elif change == "chmod":
        lib.chmod(0o755)
    elif change == "touch":
        os.utime(frozen / "agent", ns=(1, 1))
    hashed = count_reads(monkeypatch)
    after = image.cached_content_digest(cache, frozen, template)
    assert len(hashed) == 1
    assert after == image.content_digest(frozen, template)
    if change != "touch":  # the content changed, not only the identity
        assert after != before


def test_cache_file_is_root_only_and_keeps_one_entry_per_kind(tmp_path: Path) -> None:
    path = tmp_path / "state" / "cache" / "start.json"
    cache = IdentityCache(path)
    cache.put("k", "one", 1)
    cache.put("k", "two", 2)
    cache.put("other", "x", [1])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert cache.get("k", "one") is None
    assert (cache.get("k", "two"), cache.get("other", "x")) == (2, [1])
    assert sorted(json.loads(path.read_text())["entries"]) == ["k", "other"]


@pytest.mark.parametrize(
    "content",
    [b"", b"not json", b"[]", b'{"version": 99, "entries": {}}', b'{"version": 1}', b"\xff"],
)
def test_a_damaged_cache_is_an_empty_one(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "start.json"
    path.write_bytes(content)
    cache = IdentityCache(path)
    assert cache.get("k", "key") is None
    cache.put("k", "key", "v")  # and it is written anew
    assert IdentityCache(path).get("k", "key") == "v"


def test_a_symlinked_cache_file_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"version": 1, "entries": {"k": {"key": "a", "value": 1}}}))
    (tmp_path / "start.json").symlink_to(target)
    assert IdentityCache(tmp_path / "start.json").get("k", "a") is None


def runsc_binary(tmp_path: Path) -> Path:
    path = tmp_path / "runsc"
    path.write_bytes(b"\x7fELF runsc")
    path.chmod(0o755)
    return path


def answers() -> Recorder:
    return Recorder({
        "--version": (0, VERSION_2022, ""),
        "flags": (0, "", FLAGS_2022),
        "help platforms": (0, "kvm\nptrace\n", ""),
    })  # fmt: skip


def test_runsc_detection_is_cached_until_the_binary_changes(tmp_path: Path) -> None:
    binary = runsc_binary(tmp_path)
    cache = IdentityCache(tmp_path / "cache.json")
    rec = answers()
    first = runsc.detect_cached(cache, binary, run=rec)
    assert len(rec.calls) == 3
    second = runsc.detect_cached(IdentityCache(tmp_path / "cache.json"), binary, run=rec)
    assert len(rec.calls) == 3  # no runsc ran for the second start
    assert first == second
    assert second == runsc.detect(binary, run=answers())
    # An upgrade replaces the binary: a new inode, so runsc is asked again.
    (tmp_path / "runsc.new").write_bytes(b"\x7fELF runsc, newer")
    (tmp_path / "runsc.new").rename(binary)
    runsc.detect_cached(cache, binary, run=rec)
    assert len(rec.calls) == 6


def test_runsc_detection_cache_is_per_path(tmp_path: Path) -> None:
    one, other = runsc_binary(tmp_path), tmp_path / "runsc2"
    other.symlink_to(one)  # the same file, named otherwise: its own entry
    assert file_identity(one) != file_identity(other)
    cache = IdentityCache(tmp_path / "cache.json")
    rec = answers()
    assert runsc.detect_cached(cache, one, run=rec).path == one
    assert runsc.detect_cached(cache, other, run=rec).path == other
    assert len(rec.calls) == 6


def test_a_malformed_detection_entry_asks_runsc_again(tmp_path: Path) -> None:
    binary = runsc_binary(tmp_path)
    cache = IdentityCache(tmp_path / "cache.json")
    cache.put(runsc.DETECT_KIND, file_identity(binary), {"version": 7, "platforms": "ptrace"})
    rec = answers()
    assert runsc.detect_cached(cache, binary, run=rec).platforms == ("kvm", "ptrace")
    assert len(rec.calls) == 3


def test_missing_runsc_is_a_host_error(tmp_path: Path) -> None:
    with pytest.raises(HostError, match="reading runsc"):
        runsc.detect_cached(IdentityCache(tmp_path / "c.json"), tmp_path / "absent")


def test_only_a_successful_platform_trial_is_remembered(tmp_path: Path) -> None:
    binary = runsc_binary(tmp_path)
    info = runsc.detect(binary, run=answers())
    tried: list[str] = []
    outcome: dict[str, str | None] = {"systrap": "sandbox failed", "ptrace": None}

    def trial(platform: str) -> str | None:
        tried.append(platform)
        return outcome[platform]

    cache = IdentityCache(tmp_path / "cache.json")
    assert runsc.cached_trial(cache, info, trial)("systrap") == "sandbox failed"
    assert runsc.cached_trial(cache, info, trial)("systrap") == "sandbox failed"
    assert tried == ["systrap", "systrap"]  # a failure is tried again at every start
    outcome["systrap"] = None
    assert runsc.cached_trial(cache, info, trial)("systrap") is None
    assert runsc.cached_trial(cache, info, trial)("systrap") is None
    assert tried == ["systrap"] * 3  # a success is not
    (tmp_path / "runsc.new").write_bytes(b"other")
    (tmp_path / "runsc.new").rename(binary)
    assert runsc.cached_trial(cache, info, trial)("systrap") is None
    assert tried == ["systrap"] * 4  # a new binary is tried again
