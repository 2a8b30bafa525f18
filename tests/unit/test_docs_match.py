"""The hand-written user documentation says what the code does: the values, names and limits it
quotes are checked here against the code they describe (the generated references are held by
test_docgen.py, the JSON shapes by test_ctl_json.py)."""

from __future__ import annotations

import re
from pathlib import Path

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl.shapes import enum_name
from ironclawd.domain.kinds.mcp import server_view
from ironclawd.domain.mcp import McpServer

ROOT = Path(__file__).parents[2]


def _doc(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def test_the_json_doc_names_every_session_state() -> None:
    enum = admin_pb2.SessionState.DESCRIPTOR
    states = {enum_name(enum, v.number) for v in enum.values} - {"unspecified"}
    row = next(line for line in _doc("docs/ironctl-json.md").splitlines()
               if line.startswith("| session |"))  # fmt: skip
    missing = sorted(s for s in states if f"`{s}`" not in row)
    assert not missing, f"docs/ironctl-json.md: a session's state can also be {missing}"


def test_the_json_doc_refers_only_to_tables_it_has() -> None:
    text = _doc("docs/ironctl-json.md")
    for match in re.finditer(r"the (?:table of )?([a-z ]+?) above", text):
        heading = match.group(1)
        assert re.search(rf"^#+ .*{heading}", text[: match.start()], re.M | re.I), (
            f"docs/ironctl-json.md refers to {match.group(0)!r}, which it does not have"
        )


def test_the_json_doc_shows_an_mcp_server_as_ironctl_prints_it() -> None:
    local = server_view(McpServer("time", command=("/opt/time",)))
    remote = server_view(McpServer("docs", url="https://mcp.example.com/mcp"))
    row = next(line for line in _doc("docs/ironctl-json.md").splitlines()
               if line.startswith("| MCP server |"))  # fmt: skip
    assert set(local) | set(remote) <= set(re.findall(r"`([a-z_]+)`", row)), row
    assert remote["command"] == []
    assert "`[]` for a remote server" in row, row
    assert "url" not in local
    assert "not always present" in row, row
    assert local["network"] == "none"
    assert '`"none"`' in row, row
