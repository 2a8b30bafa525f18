"""The journald MESSAGE_IDs and units/ironclaw.catalog stay in step: every id has a catalog entry
with the fields journalctl -x shows, every entry an id, ids are unique 128-bit values, and every
id is used by some log call (an unused one would promise an event that never comes)."""

from __future__ import annotations

import re
from pathlib import Path

from ironclawd.domain.message_ids import MessageId

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "units" / "ironclaw.catalog"
HEADERS = ("Subject", "Defined-By", "Support", "Documentation")


def sections() -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for line in CATALOG.read_text(encoding="utf-8").splitlines():
        if not found and (line.startswith("#") or not line.strip()):
            continue
        header = re.fullmatch(r"-- (\S+)", line)
        if header:
            found.append((header.group(1), []))
        else:
            assert found, f"text before the first section: {line!r}"
            found[-1][1].append(line)
    return found


def test_ids_are_unique_128_bit_values() -> None:
    values = [m.value for m in MessageId.__members__.values()]
    assert len(values) == len(set(values)), "two MessageId members share an id (an alias)"
    for value in values:
        assert re.fullmatch(r"[0-9a-f]{32}", value), value


def test_every_id_has_one_catalog_entry_and_every_entry_an_id() -> None:
    ids = [section_id for section_id, _ in sections()]
    assert len(ids) == len(set(ids)), "a catalog id appears twice"
    assert set(ids) == {m.value for m in MessageId}


def test_every_entry_says_what_it_is_and_what_to_do() -> None:
    for section_id, lines in sections():
        blank = lines.index("")
        fields = [line.split(": ", 1) for line in lines[:blank]]
        names = [name for name, _ in fields]
        for name in HEADERS:
            assert name in names, (section_id, name)
        assert dict(fields)["Defined-By"] == "ironclaw", section_id
        assert all(value.strip() for _, value in fields), section_id
        text = " ".join(lines[blank:]).strip()
        assert len(text) > 60, (section_id, text)


def test_every_id_is_logged_somewhere_and_nothing_else_sets_message_id() -> None:
    used: set[str] = set()
    for path in sorted((REPO / "ironclawd").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        used |= set(re.findall(r"\bMessageId\.([A-Z_]+)\b", source))
        if path.name != "message_ids.py":
            assert "MESSAGE_ID" not in source, f"{path}: set MESSAGE_ID through message_id()"
    assert used <= set(MessageId.__members__), used - set(MessageId.__members__)
    assert set(MessageId.__members__) <= used, set(MessageId.__members__) - used
