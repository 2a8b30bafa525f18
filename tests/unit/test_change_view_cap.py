"""An agent's view (what the approver sees of it, before and after) had no bound of its own.
Each change was bounded at submission (payload 2.5 MiB, 3 MiB as shown: payload, the view
before and after, their diff), so the view grew by changes that each fit (MCP servers, package
adds with their dependencies) to ~1.57 MB, where a change shows at least twice the view: then
a persona change of 8 KB and the removal of any small server were refused (3.16 and 3.44 MB
as shown, reproduced over the code before; found by a review, stop 49). Now a change may not
grow the view past 512 KiB, and that bound never refuses a change that makes it smaller: a
change of a view at the bound shows in about 2 MiB and its payload."""

from __future__ import annotations

import json

import pytest

from ironclawd.domain.changes import MAX_VIEW_BYTES, ChangeState, check_size
from ironclawd.errors import InvalidArgument
from tests.unit.test_changes_domain import ROOT, World

SCHEMA = json.dumps({"type": "object", "description": "x" * 60_000})


def register(w: World, name: str) -> str:
    """An MCP server whose tool definitions take about 240 KB of the view."""
    tools = [{"name": f"t{n}", "description": "d", "input_schema": SCHEMA} for n in range(4)]
    server = {"name": name, "command": [f"/opt/mcp/{name}"], "tools": tools}
    change = w.gateway.submit("mcp", "demo", json.dumps({"op": "register", "server": server}),
                              "", ROOT)  # fmt: skip
    return w.approve(change).state.value


def unregister(w: World, name: str) -> str:
    change = w.gateway.submit("mcp", "demo", json.dumps({"op": "unregister", "server": name}),
                              "", ROOT)  # fmt: skip
    return w.approve(change).state.value


def test_a_view_stops_growing_at_the_bound_and_can_always_shrink_again() -> None:
    w = World()
    assert register(w, "one") == "applied"
    assert register(w, "two") == "applied"
    with pytest.raises(InvalidArgument) as caught:
        register(w, "three")  # before: grown to ~1.5 MiB, and then nothing could be removed
    message = str(caught.value)
    assert message.startswith("change: the agent would take ")
    assert f"expected at most {MAX_VIEW_BYTES}" in message
    assert "take something away first" in message
    assert [s.name for s in w.registry["demo"].mcp_servers] == ["one", "two"]
    assert unregister(w, "two") == "applied"
    assert unregister(w, "one") == "applied"
    assert w.registry["demo"].mcp_servers == ()


def test_a_view_already_past_the_bound_may_shrink_but_not_grow() -> None:
    big = json.dumps({"persona": "a" * (MAX_VIEW_BYTES + 10)})
    smaller = json.dumps({"persona": "a" * (MAX_VIEW_BYTES + 5)})
    check_size("{}", big, smaller, "")  # smaller: taken, whatever its size
    with pytest.raises(InvalidArgument, match="the agent would take"):
        check_size("{}", smaller, big, "")


def test_a_view_up_to_the_bound_is_taken() -> None:
    at = json.dumps({"persona": "a" * (MAX_VIEW_BYTES - 20)})
    assert len(at) <= MAX_VIEW_BYTES
    check_size("{}", "{}", at, "")
    assert ChangeState.PENDING.value == "pending"


def mcp_server(name: str, chars: int, letter: str, tag: str, tools: int = 4) -> dict[str, object]:
    """An MCP server of ``tools`` tools whose schemas hold ``chars`` of ``letter`` each."""
    schema = json.dumps({"type": "object", "description": tag + letter * chars},
                        ensure_ascii=False)  # fmt: skip
    defs = [{"name": f"t{n}", "description": "d", "input_schema": schema} for n in range(tools)]
    return {"name": name, "command": [f"/opt/mcp/{name}"], "tools": defs}


def submit_mcp(w: World, payload: dict[str, object]) -> str:
    change = w.gateway.submit("mcp", "demo", json.dumps(payload, ensure_ascii=False), "", ROOT)
    return w.approve(change).state.value


def test_a_view_is_measured_as_the_approver_sees_it_non_ascii_escaped() -> None:
    # 'é' is two bytes in the view's UTF-8 and six in the diff (\u00e9): measured in UTF-8, a
    # view of ~470 KiB passed the bound, and a change that made it smaller (the server's
    # definitions shortened) showed as 4.28 MB and was refused (MAX_SHOWN_BYTES).
    view = json.dumps({"persona": "é" * (MAX_VIEW_BYTES // 4)}, ensure_ascii=False)
    assert len(view.encode()) < MAX_VIEW_BYTES
    with pytest.raises(InvalidArgument, match="the agent would take"):
        check_size("{}", "{}", view, "")
    w = World()
    with pytest.raises(InvalidArgument, match="the agent would take"):
        submit_mcp(w, {"op": "register", "server": mcp_server("big", 60_000, "é", "v1")})


def refusal(w: World, payload: dict[str, object]) -> str:
    """Why the change was refused at submission ("" if it was applied)."""
    try:
        assert submit_mcp(w, payload) == "applied"
    except InvalidArgument as exc:
        return str(exc)
    return ""


def test_a_view_as_large_as_the_bound_admits_can_be_replaced_by_a_smaller_one() -> None:
    for letter in ("e", "é"):
        w = World()
        chars = 64_000
        # The largest server of 8 tools the bound takes, to 1000 characters.
        while why := refusal(
            w, {"op": "register", "server": mcp_server("big", chars, letter, "v1", tools=8)}
        ):
            assert "the agent would take" in why
            chars -= 1000
        smaller = mcp_server("big", chars - 1000, letter, "v2", tools=8)
        assert submit_mcp(w, {"op": "register", "server": smaller}) == "applied", (letter, chars)
