"""A change is bounded at submission: its canonical payload at most 2.5 MiB (above the largest
legitimate one, a skill of 1 MiB of files, which JSON can double), and the change as the admin
API shows it (payload, the agent before and after, their diff) at most 3 MiB, under the admin
socket's 4 MiB answer. One egress submission of 1.4 MB made every later `ironctl change list`
fail (found by a review); bounding the payload alone would not do: an egress change shows its
rules in the payload, in `after` and in the diff."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.api.admin_changes import change_to_proto
from ironclawd.domain.changes import (
    MAX_PAYLOAD_BYTES,
    MAX_SHOWN_BYTES,
    MAX_VIEW_BYTES,
    ChangeState,
    check_size,
    shown_bytes,
)
from ironclawd.domain.egress import MAX_PATH_PREFIX, MAX_PATH_PREFIXES
from ironclawd.domain.kinds.egress import MAX_EGRESS_RULES
from ironclawd.errors import InvalidArgument
from ironclawd.formats import skill as skill_format
from tests.unit import skill_samples as s
from tests.unit.test_changes_domain import ROOT, World
from tests.unit.test_skills_kind import world as skills_world

MIB = 1024 * 1024
ANSWER = 4 * MIB  # [admin] max_message_bytes default (config.py)


def _largest_skill() -> dict[str, Any]:
    """A skill at every bound of its format (docs/skills.md): 64 files, paths of 250
    characters, 1 MiB in all, every character one JSON writes as two."""
    skill_md = s.skill_md("big").encode()
    count = skill_format.MAX_FILES - 1
    each = (skill_format.MAX_TOTAL_BYTES - len(skill_md)) // count
    files = {"SKILL.md": skill_md}
    for n in range(count):
        path = f"{'a' * 99}/{'b' * 99}/{n:02}{'c' * 41}.txt"
        files[path] = (b'"\n\\\t' * each)[:each]
    assert sum(map(len, files.values())) <= skill_format.MAX_TOTAL_BYTES
    return s.payload("big", files)


def test_the_largest_skill_is_admitted_and_shown_in_one_answer() -> None:
    w = skills_world()
    change = w.gateway.submit("skills", "demo", json.dumps(_largest_skill()), "", ROOT)
    assert change.state is ChangeState.PENDING
    assert 2 * MIB < len(change.payload.encode()) <= MAX_PAYLOAD_BYTES  # over a 2 MiB cap
    shown = change_to_proto(change).ByteSize()
    assert shown <= shown_bytes(change.payload, change.before, change.after, change.reason)
    assert shown < ANSWER


def _widest_egress() -> str:
    """Every rule at its bounds: each alone is accepted, together they show three times over
    what an answer holds."""
    prefixes = [f"/{n:02}" + "a" * (MAX_PATH_PREFIX - 3) for n in range(MAX_PATH_PREFIXES)]
    rules = [{"host": f"h{n}.example.org", "path_prefixes": prefixes}
             for n in range(MAX_EGRESS_RULES)]  # fmt: skip
    return json.dumps({"rules": rules})


def test_a_change_too_large_to_show_is_refused_naming_its_size_and_the_cap() -> None:
    w = World()
    payload = _widest_egress()
    assert len(payload) < MAX_PAYLOAD_BYTES  # the payload cap alone lets it in
    assert shown_bytes(payload, "{}", payload, "") > 1.5 * ANSWER  # payload, after and diff
    with pytest.raises(InvalidArgument) as caught:
        w.gateway.submit("egress", "demo", payload, "", "session:s1")
    message = str(caught.value)
    # Since stop 50 the agent's view is bounded first (tests/unit/test_change_view_cap.py).
    assert message.startswith("change: the agent would take ")
    assert f"expected at most {MAX_VIEW_BYTES}" in message
    assert w.gateway.list_changes() == []
    assert "change.refused" in w.audit.events()


def test_a_payload_over_the_cap_is_refused_naming_its_size_and_the_cap() -> None:
    w = World()
    schema = json.dumps({"type": "object", "description": "x" * 60_000})
    tools = [{"name": f"t{n}", "description": "d", "input_schema": schema} for n in range(44)]
    server = {"name": "big", "command": ["/opt/mcp/big"], "tools": tools}
    payload = json.dumps({"op": "register", "server": server})
    with pytest.raises(InvalidArgument) as caught:
        w.gateway.submit("mcp", "demo", payload, "", ROOT)
    message = str(caught.value)
    assert message.startswith("payload: ")
    assert "bytes as canonical JSON" in message
    assert int(message.split()[1]) > MAX_PAYLOAD_BYTES
    assert message.endswith(f"expected at most {MAX_PAYLOAD_BYTES}")
    assert w.gateway.list_changes() == []


def test_check_size_bounds_and_its_measure() -> None:
    check_size("x" * MAX_PAYLOAD_BYTES, "{}", "{}", "")  # at the cap: shown ~2.5 MiB
    with pytest.raises(InvalidArgument, match=f"payload: {MAX_PAYLOAD_BYTES + 1} bytes"):
        check_size("x" * (MAX_PAYLOAD_BYTES + 1), "{}", "{}", "")
    # Views that each fit, and a payload that fits, but shown together with the diff do not.
    before, after = (json.dumps({"persona": c * (300 * 1024)}) for c in "ab")
    with pytest.raises(InvalidArgument, match=f"expected at most {MAX_SHOWN_BYTES}$"):
        check_size("x" * MAX_PAYLOAD_BYTES, before, after, "")
    # The measure is never below what the admin API sends.
    change = World().gateway.submit("persona", "demo", '{"persona": "terse"}', "r\u00e9ason", ROOT)
    proto = admin_pb2.GetChangeResponse(change=change_to_proto(change))
    assert proto.ByteSize() <= shown_bytes(change.payload, change.before, change.after,
                                           change.reason)  # fmt: skip
