"""The red-team tier reads the daemon's journal with ``journal_since`` (tests/redteam/conftest.py)
and judges from it: the model key must be absent from it, a refusal present. bd09e3e made it
read ``journalctl -o json`` after the cursor and filter the unit itself (systemd 252 skipped an
entry with ``-u``). JSON output drops what ``-o cat`` printed: a field over 4096 bytes is null
without ``--all``, a message that is not UTF-8 is an array of bytes, and ``-u``'s matches also
took systemd's own lines about the unit (UNIT= from PID 1). Here a fake journalctl answers as
journalctl(1) documents it."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from tests.redteam.conftest import journal_since

KEY = "sk-ant-redteam-0123456789"
SBX = "ironclaw-sbx-abcdefgh0001.service"
ENTRIES: list[dict[str, Any]] = [
    {"_SYSTEMD_UNIT": "ironclawd.service", "_PID": "700", "MESSAGE": "short line"},
    {"_SYSTEMD_UNIT": "ironclawd.service", "_PID": "700",
     "MESSAGE": "provider answered: " + "x" * 5000 + KEY},
    {"_SYSTEMD_UNIT": "ironclawd.service", "_PID": "700",
     "MESSAGE": list(b"refused \xff" + KEY.encode())},
    {"_SYSTEMD_UNIT": "init.scope", "_PID": "1", "UNIT": SBX,
     "MESSAGE": f"{SBX}: Main process exited, code=killed, status=9/KILL"},
    {"_SYSTEMD_UNIT": "other.service", "_PID": "800", "MESSAGE": "not ours"},
]  # fmt: skip


class FakeJournal:
    def run(self, argv: list[str], **_: Any) -> SimpleNamespace:
        assert argv[0] == "journalctl", argv
        assert "json" in argv, argv
        lines = []
        for entry in ENTRIES:
            shown = dict(entry)
            message = entry["MESSAGE"]
            if "--all" not in argv and len(message) > 4096:  # journalctl(1), -o json
                shown["MESSAGE"] = None
            lines.append(json.dumps(shown))
        return SimpleNamespace(stdout="\n".join(lines).encode() + b"\n", stderr=b"")


def test_a_long_or_binary_line_of_the_daemon_is_read() -> None:
    text = journal_since(FakeJournal(), "c")  # type: ignore[arg-type]
    assert "short line" in text
    assert text.count(KEY) == 2, text[-200:]  # the red-team's key check must see both
    assert "not ours" not in text


def test_systemds_own_lines_about_another_unit_are_read() -> None:
    text = journal_since(FakeJournal(), "c", unit=SBX)  # type: ignore[arg-type]
    assert text == f"{SBX}: Main process exited, code=killed, status=9/KILL"
