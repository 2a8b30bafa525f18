"""``--tools "read_file, write_file"`` as a person types it: the names went out as typed, so the
daemon refused " write_file" as an unknown tool, and its error did not show the leading space
(found by the config review, stop 50). Names are stripped, empty ones dropped, for ``change
submit --tools`` and ``agent create --tools`` alike."""

from __future__ import annotations

import json

import pytest

from ironclawd.ctl import argtypes, exitcodes
from ironclawd.ctl.main import main
from tests.unit.test_ctl_change_quickstart import sent, stub  # noqa: F401 (the fixture)


@pytest.mark.parametrize(
    ("typed", "names"),
    [
        ("read_file, write_file", ["read_file", "write_file"]),
        (" read_file ,,write_file, ", ["read_file", "write_file"]),
        ("", []),
        (None, []),
    ],
)
def test_names_are_stripped_and_empty_ones_dropped(typed: str | None, names: list[str]) -> None:
    assert argtypes.names(typed) == names


def test_change_submit_sends_the_names_stripped() -> None:
    argv = ["change", "submit", "--kind", "tools", "--agent", "demo", "--tools",
            "read_file, write_file"]  # fmt: skip
    assert main(argv) == exitcodes.OK
    (request,) = sent("SubmitChange")
    assert json.loads(request.payload_json) == {"tools": ["read_file", "write_file"]}


def test_agent_create_sends_the_names_stripped() -> None:
    argv = ["agent", "create", "helper", "--persona", "P", "--tools", "read_file, write_file"]
    assert main(argv) == exitcodes.OK
    (request,) = sent("SubmitChange")
    assert json.loads(request.payload_json)["tools"] == ["read_file", "write_file"]
