"""ironctl looks each gettext catalog up once per process (ctl/main.py,
``remember_catalog_lookups``): argparse's strings are still translated by a catalog that
exists, the disk is asked once however many strings the parser translates, and a caller's own
``languages`` list still gets its own lookup."""

from __future__ import annotations

import argparse
import gettext
import struct
from pathlib import Path
from typing import Any

import pytest

from ironclawd.ctl import main


def write_mo(path: Path, catalog: dict[str, str]) -> None:
    """A GNU .mo file (the format gettext reads): header, two offset tables, the strings."""
    keys = sorted(catalog)
    ids = b"".join(k.encode() + b"\0" for k in keys)
    strs = b"".join(catalog[k].encode() + b"\0" for k in keys)
    start = 7 * 4 + 16 * len(keys)
    id_table, str_table, offset = [], [], 0
    for k in keys:
        id_table += [len(k.encode()), start + offset]
        offset += len(k.encode()) + 1
    offset = 0
    for k in keys:
        str_table += [len(catalog[k].encode()), start + len(ids) + offset]
        offset += len(catalog[k].encode()) + 1
    header = struct.pack("<7I", 0x950412DE, 0, len(keys), 7 * 4, 7 * 4 + 8 * len(keys), 0, 0)
    path.parent.mkdir(parents=True)
    path.write_bytes(
        header + struct.pack(f"<{len(id_table)}I", *id_table)
        + struct.pack(f"<{len(str_table)}I", *str_table) + ids + strs
    )  # fmt: skip


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[Any, ...]]:
    """A German catalog for argparse's domain under tmp_path, LANGUAGE=de, and gettext.find
    counting its calls; everything put back after the test."""
    write_mo(tmp_path / "de" / "LC_MESSAGES" / "messages.mo", {"usage: ": "Aufruf: "})
    monkeypatch.setattr(gettext, "_localedirs", {**gettext._localedirs,  # type: ignore[attr-defined]
                                                 "messages": str(tmp_path)})  # fmt: skip
    monkeypatch.setattr(gettext, "_translations", {})
    for name in ("LC_ALL", "LC_MESSAGES", "LANG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANGUAGE", "de")
    calls: list[tuple[Any, ...]] = []
    real = gettext.find

    def find(*args: Any, **kwargs: Any) -> Any:
        calls.append(args + tuple(kwargs.values()))
        return real(*args, **kwargs)

    monkeypatch.setattr(gettext, "find", find)
    return calls


def test_strings_are_translated_with_one_lookup(counted: list[tuple[Any, ...]]) -> None:
    main.remember_catalog_lookups()
    parser = main.build_parser("status")
    assert parser.format_usage().startswith("Aufruf: ironctl")
    assert len(counted) == 1, counted  # every other string the parser translated was remembered
    main.remember_catalog_lookups()  # a second call does not wrap twice
    argparse.ArgumentParser(prog="x").format_usage()
    assert len(counted) == 1, counted


def test_an_explicit_language_list_is_looked_up_each_time(
    counted: list[tuple[Any, ...]],
) -> None:
    main.remember_catalog_lookups()
    for _ in range(2):
        gettext.find("messages", None, ["de"])
    assert len(counted) == 2, counted
