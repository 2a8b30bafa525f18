"""The dataclass code cache (ironclawd/dataclass_cache.py): classes made through it are the classes
``dataclasses`` makes alone, a saved file makes the next process compile nothing, and a file
that cannot be trusted is never used. The install into a fresh interpreter and the daemon's use
are in tests/integration/test_dataclass_cache.py."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import marshal
import os
import types
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ironclawd.dataclass_cache import HEADER, CodeCache


def shapes() -> list[type]:
    """Dataclasses of the kinds the daemon has: frozen with defaults and a factory, ordered,
    slotted, keyword-only, with a class variable and an InitVar."""

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        name: str
        count: int = 2
        tags: tuple[str, ...] = dataclasses.field(default_factory=tuple)

    @dataclasses.dataclass(order=True)
    class Ordered:
        rank: int
        label: str = dataclasses.field(default="x", compare=False)

    @dataclasses.dataclass(slots=True, kw_only=True)
    class Slotted:
        a: list[int] = dataclasses.field(default_factory=list)
        b: float = 0.5

    @dataclasses.dataclass
    class WithInit:
        seed: dataclasses.InitVar[int]
        value: int = 0
        limit: Any = None

        def __post_init__(self, seed: int) -> None:
            self.value = seed * 2

    return [Frozen, Ordered, Slotted, WithInit]


def made_through(cache: CodeCache | None, monkeypatch: pytest.MonkeyPatch) -> list[type]:
    with monkeypatch.context() as patch:
        if cache is not None:
            patch.setattr(dataclasses, "exec", cache.exec, raising=False)
        return shapes()


def behaviour(classes: list[Any]) -> list[object]:
    frozen, ordered, slotted, with_init = classes
    f = frozen("n", tags=("t",))
    try:
        f.name = "other"
        refused = False
    except dataclasses.FrozenInstanceError:
        refused = True
    w = with_init(3)
    return [
        *(str(inspect.signature(c.__init__)) for c in classes),
        # Compiled without this module's __future__ flags, as exec would: real types, not text.
        *(c.__init__.__annotations__ for c in classes),
        repr(f), f == frozen("n", 2, ("t",)), hash(f) == hash(frozen("n", tags=("t",))), refused,
        ordered(1, "a") < ordered(2, "b"), ordered(1, "a") == ordered(1, "z"),
        repr(slotted(a=[1])), hasattr(slotted(), "__dict__"),
        (w.value, w.limit), repr(w),
    ]  # fmt: skip


def test_classes_made_through_the_cache_are_those_dataclasses_makes_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = behaviour(made_through(None, monkeypatch))
    first = CodeCache(tmp_path / "cache.bin")
    assert behaviour(made_through(first, monkeypatch)) == expected  # compiled here
    made = first.misses + first.hits  # dataclasses' exec calls for the four classes
    assert first.misses > 10
    assert first.save()
    second = CodeCache(tmp_path / "cache.bin")
    second.load()
    assert behaviour(made_through(second, monkeypatch)) == expected  # taken from the file
    assert (second.misses, second.problem) == (0, "")
    assert second.hits == made


def test_a_saved_file_is_private_and_rewritten_only_after_a_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cache.bin"
    cache = CodeCache(path)
    assert not cache.save()  # nothing compiled: nothing to write
    assert not path.exists()
    made_through(cache, monkeypatch)
    assert cache.save()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in tmp_path.iterdir()] == ["cache.bin"]  # no temporary file left
    before = path.stat().st_mtime_ns
    again = CodeCache(path)
    again.load()
    made_through(again, monkeypatch)
    assert not again.save()
    assert path.stat().st_mtime_ns == before


def test_the_file_keeps_only_what_its_process_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cache.bin"
    old = CodeCache(path)
    old.exec("def gone(): pass\n", {}, {})
    old.save()
    cache = CodeCache(path)
    cache.load()
    made_through(cache, monkeypatch)
    cache.save()
    kept = marshal.loads(path.read_bytes()[len(HEADER) + 4 :])  # after the header and its CRC
    assert "def gone(): pass\n" not in kept
    assert kept
    assert all(isinstance(code, types.CodeType) for code in kept.values())


def good_file(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = CodeCache(path)
    made_through(cache, monkeypatch)
    cache.save()


def _symlink(path: Path) -> None:
    path.rename(path.with_name("real"))
    path.symlink_to(path.with_name("real"))


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def entries(body: Any) -> bytes:
    return with_crc(marshal.dumps(body))


def with_crc(body: bytes) -> bytes:
    return HEADER + zlib.crc32(body).to_bytes(4, "little") + body


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


UNTRUSTED: dict[str, tuple[Callable[[Path], object], str]] = {
    "group-writable": (lambda p: p.chmod(0o620), "writable by others (mode 0620)"),
    "world-writable": (lambda p: p.chmod(0o602), "writable by others (mode 0602)"),
    "a symlink": (_symlink, "cannot open"),
    "a directory": (_directory, "not a regular file"),
    "another Python's bytecode": (
        lambda p: p.write_bytes(p.read_bytes().replace(HEADER, HEADER[:-4] + b"\0\0\r\n", 1)),
        "not a cache of this Python's bytecode",
    ),
    "cut short": (
        lambda p: p.write_bytes(p.read_bytes()[: len(HEADER) + 100]),
        "damaged (checksum mismatch)",
    ),
    "a byte flipped on disk": (_flip_a_byte, "damaged (checksum mismatch)"),
    "not marshal data, checksum right": (
        lambda p: p.write_bytes(with_crc(b"\xffgarbage")),
        "damaged (not marshal data)",
    ),
    "not a mapping": (lambda p: p.write_bytes(entries([1, 2])), "not a mapping of text to code"),
    "text mapped to text": (
        lambda p: p.write_bytes(entries({"def f(): pass\n": "x"})),
        "not a mapping of text to code",
    ),
}


@pytest.mark.parametrize("spoil", list(UNTRUSTED), ids=list(UNTRUSTED))
def test_a_file_that_cannot_be_trusted_is_not_used(
    spoil: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cache.bin"
    good_file(path, monkeypatch)
    change, problem = UNTRUSTED[spoil]
    change(path)
    cache = CodeCache(path)
    cache.load()
    assert cache.problem.startswith(problem), cache.problem
    made_through(cache, monkeypatch)
    assert cache.hits < cache.misses  # everything compiled here (shapes repeat one text or two)


def test_a_file_of_another_user_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cache.bin"
    good_file(path, monkeypatch)
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)
    cache = CodeCache(path)
    cache.load()
    assert cache.problem == f"owned by uid {os.getuid()}, not {os.getuid() + 1}"
    made_through(cache, monkeypatch)
    assert cache.hits < cache.misses


def test_code_and_missing_files_pass_through(tmp_path: Path) -> None:
    cache = CodeCache(tmp_path / "absent.bin")
    cache.load()
    assert cache.problem == ""  # none yet: the first start writes it
    space: dict[str, Any] = {}
    cache.exec(compile("x = 1\n", "<string>", "exec"), space, space)
    assert space["x"] == 1
    assert (cache.hits, cache.misses) == (0, 0)
    cache.exec("y = 2\n", space, space)
    cache.exec("y = 2\n", space, space)
    assert space["y"] == 2
    assert (cache.hits, cache.misses) == (1, 1)
    assert isinstance(cache._codes["y = 2\n"], types.CodeType)


def test_the_daemon_writes_at_ready_logs_a_distrusted_file_and_survives_a_failed_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from ironclawd.daemon import _save_dataclass_cache  # noqa: PLC0415 (the daemon's own step)

    asyncio.run(_save_dataclass_cache(None))  # no cache installed: nothing to do
    path = tmp_path / "cache.bin"
    good_file(path, monkeypatch)
    path.chmod(0o666)
    cache = CodeCache(path)
    cache.load()
    made_through(cache, monkeypatch)
    with caplog.at_level(logging.INFO, logger="ironclawd"):
        asyncio.run(_save_dataclass_cache(cache))
    assert "not used: writable by others (mode 0666); writing a new one" in caplog.text
    assert "written" in caplog.text
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    caplog.clear()
    gone = CodeCache(tmp_path / "no-such-dir" / "cache.bin")
    made_through(gone, monkeypatch)
    with caplog.at_level(logging.INFO, logger="ironclawd"):
        asyncio.run(_save_dataclass_cache(gone))  # does not raise: the daemon goes on
    assert "not written: No such file or directory" in caplog.text


def test_no_failure_of_the_write_reaches_the_daemons_task_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from ironclawd.daemon import _save_dataclass_cache  # noqa: PLC0415 (the daemon's own step)

    cache = CodeCache(tmp_path / "cache.bin")
    made_through(cache, monkeypatch)

    def broken(texts: list[str]) -> None:
        raise ValueError("unmarshallable")

    monkeypatch.setattr(cache, "write", broken)
    asyncio.run(_save_dataclass_cache(cache))  # does not raise
    assert "not written: ValueError('unmarshallable')" in caplog.text
