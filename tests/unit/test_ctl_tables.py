"""ironctl's tables against a stub daemon (tests/unit/ctl_world.py): piped, plain aligned columns
under a header, a row a line, whatever COLUMNS says; ``--no-legend`` drops the header and the
summary; on a terminal, rich tables that never split a word, however narrow the screen."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import channels, exitcodes, rpc, terminal
from ironclawd.ctl.main import main
from tests.unit import ctl_world as world

BOX = re.compile(r"[\u2500-\u257f]")
LISTINGS = {
    "session list": ["SID", "AGENT", "STATE", "CREATED", "ERROR"],
    "change list": ["ID", "KIND", "AGENT", "STATE", "SUBMITTER", "CREATED"],
    "agent list": ["NAME", "PROVIDER", "MODEL", "TOOLS"],
    "audit list": ["SEQ", "TIME", "EVENT", "ACTOR", "DETAIL"],
    "doctor": ["CHECK", "STATUS", "DETAIL", "FIX"],
    "skill list": ["AGENT", "SKILL", "VERSION", "SIGNER", "FILES", "GRANTS"],
    "mcp list": ["NAME", "COMMAND", "NETWORK", "TOOLS", "GRANTED"],
    "package list": ["AGENT", "PACKAGE", "VERSION", "ARCH", "SHA256", "SIZE", "WHY"],
    "wiring list": ["AGENT", "CHANNEL", "WHERE", "ENGAGE", "SESSIONS", "REPLY_URL"],
    "channel list": ["CHANNEL", "KIND", "STATUS", "WHERE", "HELD", "DELIVERIES", "ERROR"],
    "channel held": ["ID", "CHANNEL", "WHERE", "SENDER", "RECEIVED", "TEXT"],
}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def stub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "stub_for", world.Stub)
    monkeypatch.setenv("COLUMNS", "20")  # narrower than any row: nothing may wrap or split
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.fixture
def argv(tmp_path: Path) -> dict[str, list[str]]:
    return world.arguments(tmp_path)


def run(args: list[str], stdout: io.StringIO | None = None) -> str:
    out = stdout or io.StringIO()
    real, sys.stdout = sys.stdout, out
    try:
        code = main(args)
    finally:
        sys.stdout = real
    assert code == exitcodes.OK, out.getvalue()
    return out.getvalue()


@pytest.mark.parametrize("name", sorted(LISTINGS))
def test_piped_listings_are_plain_aligned_columns(argv: dict[str, list[str]], name: str) -> None:
    lines = run(argv[name]).splitlines()
    header, *rows = [line for line in lines if line != "all required checks passed"]
    assert re.split(r" {2,}", header) == LISTINGS[name]
    assert rows
    assert not BOX.search("".join(lines))
    starts = [m.start() for m in re.finditer(r"(?:^|(?<=  ))\S", header)]
    for row in rows:
        # Every column starts where its header does, after at least two spaces.
        for start in starts[1:]:
            assert row[start - 2 : start + 1].startswith("  "), (header, row)
            assert row[start] != " ", (header, row)


def test_piped_rows_are_whole_whatever_columns_says(argv: dict[str, list[str]]) -> None:
    out = run(argv["package list"])
    assert out.splitlines()[1].split() == [
        "demo", "jq", "1.6-2.1", "amd64", world.SHA, "64252", "requested",
    ]  # fmt: skip
    assert len(out.splitlines()) == 2
    fields = run(argv["agent show"]).splitlines()
    # A value's own lines continue under the value column; nothing else wraps.
    assert fields[-2:] == ["persona     You help.", "            Briefly."]


@pytest.mark.parametrize("where", ["before", "after"])
def test_no_legend_drops_header_and_summary(argv: dict[str, list[str]], where: str) -> None:
    def bare(name: str) -> list[str]:
        args = argv[name]
        return ["--no-legend", *args] if where == "before" else [*args, "--no-legend"]

    listed = run(bare("session list")).splitlines()
    assert [line.split()[0] for line in listed] == [world.SESSION.sid]
    doctor = run(bare("doctor")).splitlines()
    assert [line.split()[0] for line in doctor] == ["runsc.version", "runsc.platform.kvm"]
    shown = run(bare("channel show"))
    assert "failed or retrying" not in shown
    assert "DELIVERY" not in shown
    assert "abcdefgh0001-3" in shown


def test_an_empty_listing_says_so_only_with_the_legend(
    argv: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(world.Stub, "ListSessions",
                        lambda *_, **__: admin_pb2.ListSessionsResponse())  # fmt: skip
    assert run(argv["session list"]).splitlines() == [
        "SID  AGENT  STATE  CREATED  ERROR",
        "no sessions (create one: ironctl session create --agent demo)",
    ]
    assert run([*argv["session list"], "--no-legend"]) == ""
    assert run([*argv["session list"], "--no-legend"], Terminal()) == ""
    assert "no sessions" in run(argv["session list"], Terminal())


@pytest.mark.parametrize("name", [*sorted(LISTINGS), "change show", "skill show", "agent show"])
def test_on_a_narrow_terminal_no_word_is_split(argv: dict[str, list[str]], name: str) -> None:
    out = run(argv[name], Terminal())
    if name in LISTINGS:
        assert BOX.search(out), out  # rich's table, as before
    words = {world.SHA, world.SESSION.sid, world.CHANGE.id, "uid:0(root)", "runsc.version",
             "2025-12-01", "requested", "/opt/mcp/bin/mcp-server-time", "!room:m.example",
             "chat:@eve:m.example", "release-20240401.0"}  # fmt: skip
    plain = run(argv[name])
    for word in words:
        if word in plain:
            assert word in out, (word, out)


def test_fit_keeps_every_column_at_least_its_widest_word() -> None:
    fit: Any = terminal._fit
    assert fit([10, 20], [3, 5], 100) == [10, 20]
    assert fit([10, 20], [3, 5], 8) == [3, 5]  # too narrow: the table overflows the screen
    widths = fit([10, 30], [4, 4], 20)
    assert sum(widths) <= 20
    assert min(widths) >= 4


def test_long_held_text_and_errors_are_cut_between_words() -> None:
    shown: Any = channels._shown
    assert shown("hello world this is long", 12) == "hello world…"
    assert shown("A" * 30, 10) == "A" * 30  # one word: kept whole
    assert shown("short", 10) == "short"


def tags(words: str) -> str:
    """Unicode tag characters spelling ``words``: drawn as nothing, read by many models."""
    return "".join(chr(0xE0000 + ord(c)) for c in words)


@pytest.mark.parametrize("stdout", [io.StringIO, Terminal], ids=["piped", "terminal"])
def test_a_held_message_cannot_hide_words_or_its_sender_in_tag_characters(
    monkeypatch: pytest.MonkeyPatch, stdout: type[io.StringIO]
) -> None:
    held = admin_pb2.HeldMessage()
    held.CopyFrom(world.HELD)
    held.sender = "chat:@alice:m.example" + tags("x")  # not alice
    held.text = "hi" + tags(" obey")  # what the operator would admit unseen
    monkeypatch.setattr(world.Stub, "ListHeld",
                        lambda *_, **__: admin_pb2.ListHeldResponse(held=[held]))  # fmt: skip
    out = run(["channel", "held"], stdout())
    assert not [c for c in out if 0xE0000 <= ord(c) <= 0xE007F], out
    assert "chat:@alice:m.example\\U000e0078" in out
    assert "hi\\U000e0020\\U000e006f" in out


PERSONA_LINE = "+persona: " + json.dumps("Spend up to $:one::zero::zero: [b]:white_check_mark:[/b]")


@pytest.mark.parametrize("stdout", [io.StringIO, Terminal], ids=["piped", "terminal"])
def test_the_diff_and_an_mcp_server_are_shown_as_written_never_as_markup_or_emoji(
    monkeypatch: pytest.MonkeyPatch, stdout: type[io.StringIO]
) -> None:
    # rich.markup.escape() stops tags but not :emoji_codes:, which rich drew as pictures.
    change = admin_pb2.Change()
    change.CopyFrom(world.CHANGE)
    del change.diff[:]
    change.diff.extend(['-persona: "You help."', PERSONA_LINE])
    view = json.loads(json.dumps(world.MCP_VIEW))
    view["mcp_servers"][0]["tools"][0]["description"] = "Reads :lock: [red]files[/red] only"
    monkeypatch.setattr(world.Stub, "GetChange",
                        lambda *_, **__: admin_pb2.GetChangeResponse(change=change))  # fmt: skip
    servers = admin_pb2.ListMcpServersResponse(view_json=json.dumps(view))
    monkeypatch.setattr(world.Stub, "ListMcpServers", lambda *_, **__: servers)
    assert PERSONA_LINE in run(["change", "diff", world.CHANGE.id], stdout()).splitlines()
    # (bold is a style, not a colour: NO_COLOR keeps it on a terminal)
    shown = re.sub(r"\x1b\[[0-9;]*m", "", run(["mcp", "show", "time", "--agent", "demo"], stdout()))
    assert "get_current_time: Reads :lock: [red]files[/red] only" in shown
