"""ironctl --json: one shape per resource across commands (docs/ironctl-json.md). Every command
runs against a stub daemon (tests/unit/ctl_world.py): its JSON has the documented top-level keys,
enums are spelled as people read them, 64-bit integers are numbers, timestamps are seconds or
null; and for every resource, the item a listing shows is the object its show prints."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, rpc, shapes
from ironclawd.ctl.main import main
from tests.harness.ctl_commands import commands
from tests.unit import ctl_world as world
from tests.unit.test_ctl_containment import Signed

DOC = Path(__file__).parents[2] / "docs" / "ironctl-json.md"
NO_JSON = {"chat"}  # a conversation, printed as text whatever --json says
# The API itself, in protobuf's own JSON mapping (as grpcurl would): tests/unit/test_ctl_api.py.
RAW = {"api list", "api describe", "api call"}
STREAMS = {"session logs", "audit list"}  # a JSON document a line

SESSION = set(admin_pb2.Session.DESCRIPTOR.fields_by_name)
CHANGE = set(admin_pb2.Change.DESCRIPTOR.fields_by_name)
# Each command's top-level keys (a stream: each line's keys).
SHAPES: dict[str, set[str]] = {
    "status": set(admin_pb2.GetStatusResponse.DESCRIPTOR.fields_by_name),
    "doctor": {"checks", "ok"},
    "session create": SESSION, "session show": SESSION, "session start": SESSION,
    "session stop": SESSION,
    "session list": {"sessions"},
    "session rm": {"removed"},
    "session logs": {"timestamp", "message", "source"},
    "session verify": {"checked", "ok", "first_bad_seq", "problem", "pruned"},
    "send": {"seq", "reply"},
    "change submit": CHANGE, "change show": CHANGE, "change diff": CHANGE,
    "change approve": CHANGE, "change reject": CHANGE, "agent create": CHANGE,
    "skill add": CHANGE, "skill remove": CHANGE, "mcp add": CHANGE, "mcp grant": CHANGE,
    "mcp remove": CHANGE, "package add": CHANGE, "package remove": CHANGE, "package set": CHANGE,
    "change list": {"changes"}, "change pending": {"changes"},
    "agent list": {"agents"},
    "agent show": set(admin_pb2.Agent.DESCRIPTOR.fields_by_name),
    "audit list": {"seq", "time", "event", "actor", "prev", "mac"},
    "audit verify": {"ok", "records", "first_bad_seq", "problem", "append_only"},
    "containment verify": {"valid", "outcome", "exit", "key_id", "trusted_comment",
                           "generated_at", "versions", "summary", "escaped", "errors"},
    "skill list": {"skills"},
    "skill show": {"agent", "name", "version", "signer", "description", "manifest_sha256",
                   "files", "grants"},
    "skill sign": {"name", "signature", "key_id"},
    "skill manifest": {"name", "manifest"},
    "skill verify": {"name", "signer", "valid"},
    "mcp list": {"agent", "servers", "grants"},
    "mcp show": {"agent", "server", "grants"},
    "package list": {"packages"},
    "wiring list": {"routes"},
    "wiring show": {"agent", "routes"},
    "permissions show": {"agent", "allow", "unknown", "approvers"},
    "channel list": {"channels"},
    "channel show": set(admin_pb2.Channel.DESCRIPTOR.fields_by_name),
    "channel test": {"detail", "ok"},
    "channel held": {"held"},
    "channel admit": {"admission", "sid", "seq"},
    "channel drop": {"dropped"},
}  # fmt: skip
ENUM_NAMES = {v.name for e in admin_pb2.DESCRIPTOR.enum_types_by_name.values() for v in e.values}


@pytest.fixture(autouse=True)
def stub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "stub_for", world.Stub)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
    """Every command's --json documents (a list: streams print several)."""
    found: dict[str, list[Any]] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rpc, "stub_for", world.Stub)
        tmp = tmp_path_factory.mktemp("ctl")
        argv = world.arguments(tmp)
        argv["containment verify"] = _containment(tmp, patch)
        for name, args in argv.items():
            found[name] = _run([*args, "--json"])
    return found


def _containment(tmp: Path, patch: pytest.MonkeyPatch) -> list[str]:
    (tmp / "report").mkdir()
    signed = Signed(tmp / "report", patch)
    return ["containment", "verify", str(signed.path), "--pubkey", str(signed.pubkey)]


def _run(argv: list[str]) -> list[Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    assert code == exitcodes.OK, (argv, out.getvalue())
    text = out.getvalue()
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines()]


def test_every_command_is_covered_and_documented() -> None:
    names = {c.name for c in commands()}
    assert names - NO_JSON - RAW == set(SHAPES), "a command without a JSON shape here"
    documented = DOC.read_text()
    missing = [n for n in sorted({*SHAPES, *RAW}) if f"`{n}`" not in documented]
    assert not missing, f"docs/ironctl-json.md does not name {missing}"


def test_every_command_prints_its_documented_top_level_keys(
    outputs: dict[str, list[Any]],
) -> None:
    for name, docs in outputs.items():
        assert docs, name
        if name not in STREAMS:
            assert len(docs) == 1, (name, docs)
        for doc in docs:
            if name == "audit list":  # the record's event fields follow these
                assert SHAPES[name] <= set(doc), (name, sorted(doc))
            else:
                assert set(doc) == SHAPES[name], (name, sorted(doc))


def _walk(value: Any, key: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [kv for k, v in value.items() for kv in _walk(v, k)]
    if isinstance(value, list):
        return [kv for v in value for kv in _walk(v, key)]
    return [(key, value)]


def test_enums_are_short_integers_numbers_and_timestamps_seconds(
    outputs: dict[str, list[Any]],
) -> None:
    for name, docs in outputs.items():
        for key, value in _walk(docs):
            assert value not in ENUM_NAMES, (name, key, value)
            if isinstance(value, str) and re.fullmatch(r"\d+", value):
                # Only a held message's id is a decimal string (HeldMessage.id in the proto).
                assert (name, key) in {("channel held", "id"), ("channel drop", "dropped")}, (
                    name, key, value)  # fmt: skip
            if key.endswith("_at") or key in ("timestamp", "time"):
                assert value is None or isinstance(value, float | int), (name, key, value)
    assert outputs["session list"][0]["sessions"][0]["state"] == "running"
    assert [c["status"] for c in outputs["doctor"][0]["checks"]] == ["pass", "skip"]
    assert outputs["agent show"][0]["memory_bytes"] == world.BIG
    assert outputs["send"][0]["reply"]["seq"] == world.BIG + 1
    assert outputs["channel show"][0]["counters"]["received"] == world.BIG
    assert outputs["channel show"][0]["failures"][0]["next_at"] is None
    assert outputs["containment verify"][0]["generated_at"] > 1.7e9


def test_list_and_show_agree_for_every_resource(outputs: dict[str, list[Any]]) -> None:
    one = {name: docs[0] for name, docs in outputs.items()}
    assert one["session list"]["sessions"] == [one["session show"]] == [one["session create"]]
    assert one["session show"] == one["session start"] == one["session stop"]
    assert one["change list"]["changes"] == [one["change show"]] == one["change pending"]["changes"]
    for verb in ("change approve", "agent create", "skill add", "mcp add", "package add"):
        assert one[verb] == one["change show"], verb
    assert one["agent list"]["agents"] == [one["agent show"]]
    assert one["skill list"]["skills"] == [one["skill show"]]
    server = one["mcp show"]
    assert one["mcp list"] == {"agent": server["agent"], "servers": [server["server"]],
                               "grants": server["grants"]}  # fmt: skip
    assert one["wiring list"]["routes"] == one["wiring show"]["routes"]
    assert one["channel list"]["channels"] == [one["channel show"]]
    assert one["send"]["reply"]["seq"] == world.REPLY.seq
    assert one["status"]["caller"]["user_name"] == "root"


def test_enum_names_follow_the_enum_type() -> None:
    state = admin_pb2.SessionState.DESCRIPTOR
    assert [shapes.enum_name(state, v.number) for v in state.values] == [
        "unspecified", "creating", "starting", "running", "stopping", "stopped", "failed",
        "recovering",
    ]  # fmt: skip
    assert shapes.enum_name(state, 99) == "unknown"
    check = admin_pb2.CheckStatus.DESCRIPTOR
    assert shapes.enum_name(check, admin_pb2.CHECK_STATUS_WARN) == "warn"


# -- a decision nobody confirmed -----------------------------------------------------------------


class Keyboard(io.TextIOWrapper):
    """Standard input on a terminal: what it holds is what a person types."""

    def isatty(self) -> bool:
        return True


decided: list[str] = []


class Deciding(world.Stub):
    def ApproveChange(self, *_: Any, **__: Any) -> Any:
        decided.append("approve")
        return self._change()

    def RejectChange(self, *_: Any, **__: Any) -> Any:
        decided.append("reject")
        return self._change()


@pytest.fixture
def deciding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "stub_for", Deciding)
    decided.clear()


@pytest.mark.usefixtures("deciding")
@pytest.mark.parametrize("verb", ["approve", "reject"])
def test_a_decision_off_a_terminal_without_yes_is_a_json_error(
    verb: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"y\n"), encoding="utf-8"))
    assert main(["change", verb, world.CHANGE.id, "--json"]) == exitcodes.FAILED
    out, err = capsys.readouterr()
    assert err == ""
    assert json.loads(out) == {"error": {
        "code": "NOT_CONFIRMED", "exit": exitcodes.FAILED,
        "message": f"{verb} {world.CHANGE.id}: not a terminal; pass --yes to {verb} without asking",
    }}  # fmt: skip
    assert main(["change", verb, world.CHANGE.id]) == exitcodes.FAILED
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"ironctl: change: {verb} {world.CHANGE.id}: not a terminal; "
                              f"pass --yes to {verb} without asking\n")  # fmt: skip
    assert decided == []


@pytest.mark.usefixtures("deciding")
@pytest.mark.parametrize(("typed", "decision"), [(b"y\n", "approve"), (b"n\n", None)])
def test_on_a_terminal_json_keeps_standard_output_for_its_one_document(
    typed: bytes,
    decision: str | None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.stdin", Keyboard(io.BytesIO(typed), encoding="utf-8"))
    code = main(["change", "approve", world.CHANGE.id, "--json"])
    out, err = capsys.readouterr()
    # The person reads the change and the question where they type: standard error.
    assert '+persona: "You are terse."' in err
    assert err.endswith(f"approve change {world.CHANGE.id} (persona on demo)? [y/N] ")
    doc = json.loads(out)  # one document, nothing else
    if decision:
        assert (code, doc["id"], decided) == (exitcodes.OK, world.CHANGE.id, [decision])
    else:
        assert code == exitcodes.FAILED
        assert doc["error"]["code"] == "NOT_CONFIRMED"
        assert (
            doc["error"]["message"] == f"approve {world.CHANGE.id}: not confirmed; nothing decided"
        )
        assert decided == []
