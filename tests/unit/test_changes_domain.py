"""Capability changes (ironclawd/domain/changes.py) and the gateway's decisions over them
(ironclawd/services/gateway.py, with an in-memory store and a hand-driven clock).

What an approver relies on: every kind's payload is checked before anything is queued; the hash
an approval names covers the kind, the target, the payload and the agent as it was; the diff
shows every control, escape and bidi character as an escape; and a decision is made once.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ironclawd.domain.agents import AgentMount, AgentSpec
from ironclawd.domain.changes import (
    APPLIABLE,
    KINDS,
    MAX_PERSONA,
    Change,
    ChangeState,
    agent_view,
    apply_payload,
    canonical,
    change_hash,
    check_payload,
    diff_lines,
    transition,
)
from ironclawd.domain.egress import rule_from_mapping
from ironclawd.domain.tools import CATALOG
from ironclawd.errors import Conflict, InvalidArgument, NotFound, PolicyDenied, RateLimited
from ironclawd.host.mounts import HostMounts
from ironclawd.services.gateway import Gateway, GatewayPolicy
from ironclawd.services.registry import Registry
from tests.fakes import FakeClock, MemoryAgents, MemoryChanges, RecordingAudit

DEMO = AgentSpec("demo")

# -- payload verifiers, per kind ---------------------------------------------------------------


def test_persona_payload_is_text_of_bounded_size_and_nothing_else() -> None:
    assert check_payload("persona", "demo", '{"persona": "Be terse."}') == {"persona": "Be terse."}
    assert check_payload("persona", "demo", json.dumps({"persona": "x" * MAX_PERSONA}))
    bad = [
        ("{}", "payload.persona"),
        ('{"persona": ""}', "payload.persona"),
        ('{"persona": "   \\n"}', "payload.persona"),
        ('{"persona": 7}', "payload.persona"),
        (json.dumps({"persona": "x" * (MAX_PERSONA + 1)}), f"at most {MAX_PERSONA}"),
        ('{"persona": "ok", "tools": []}', "unexpected key(s) tools"),
        ('{"persona": "ok", "provider": "openai"}', "unexpected key(s) provider"),
        ('["persona"]', "expected a JSON object"),
        ("not json", "not valid JSON"),
    ]
    for payload, needle in bad:
        with pytest.raises(InvalidArgument) as err:
            check_payload("persona", "demo", payload)
        assert needle in str(err.value), (payload, str(err.value))


def test_tools_payload_names_known_tools_only_deduplicated_in_order() -> None:
    got = check_payload("tools", "demo", '{"tools": ["list_files", "read_file", "list_files"]}')
    assert got == {"tools": ["list_files", "read_file"]}
    assert check_payload("tools", "demo", '{"tools": []}') == {"tools": []}
    for payload, needle in [
        ('{"tools": ["read_file", "shell"]}', "unknown tool(s) shell"),
        ('{"tools": "read_file"}', "expected a list of tool names"),
        ('{"tools": [1]}', "expected a list of tool names"),
        ("{}", "expected a list of tool names"),
        ('{"tools": [], "persona": "x"}', "unexpected key(s) persona"),
    ]:
        with pytest.raises(InvalidArgument) as err:
            check_payload("tools", "demo", payload)
        assert needle in str(err.value), (payload, str(err.value))
    assert "shell" not in CATALOG


def test_create_agent_payload_defaults_to_the_offline_mock_and_checks_the_rest() -> None:
    got = check_payload("create_agent", "helper", '{"persona": "You help."}')
    assert got == {"persona": "You help.", "tools": [], "provider": "mock", "model": "mock-1"}
    full = '{"persona": "p", "tools": ["read_file"], "provider": "anthropic", "model": "m"}'
    assert check_payload("create_agent", "helper", full)["provider"] == "anthropic"
    for payload, needle in [
        ('{"tools": []}', "payload.persona"),
        ('{"persona": "p", "provider": "evil"}', "payload.provider"),
        ('{"persona": "p", "model": ""}', "payload.model"),
        ('{"persona": "p", "credential": "k"}', "unexpected key(s) credential"),
        ('{"persona": "p", "egress": []}', "unexpected key(s) egress"),
    ]:
        with pytest.raises(InvalidArgument) as err:
            check_payload("create_agent", "helper", payload)
        assert needle in str(err.value), (payload, str(err.value))


def test_every_kind_is_appliable() -> None:
    # A kind that is named but refused is tested in test_change_kinds.py (RefusedKind).
    assert set(KINDS) == APPLIABLE


def test_unknown_kind_and_bad_agent_names_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="kind: expected one of"):
        check_payload("approve", "demo", "{}")
    for name in ("", "Demo", "1abc", "a/b", "a" * 64, "demo\n", "d\u202eemo"):
        with pytest.raises(InvalidArgument, match="agent: expected a name"):
            check_payload("persona", name, '{"persona": "x"}')


def test_apply_payload_changes_only_what_the_kind_names() -> None:
    spec = replace(DEMO, memory_bytes=123, credential="k")
    after = apply_payload("persona", "demo", spec, {"persona": "New."})
    assert after == replace(spec, persona="New.")
    after = apply_payload("tools", "demo", spec, {"tools": ["read_file"]})
    assert after == replace(spec, tools=("read_file",))
    payload = {"persona": "p", "tools": [], "provider": "mock", "model": "m"}
    with pytest.raises(Conflict, match="already exists"):
        apply_payload("create_agent", "demo", spec, payload)
    with pytest.raises(Conflict, match="does not exist"):
        apply_payload("persona", "ghost", None, {"persona": "p"})


# -- the hash an approval names ----------------------------------------------------------------


def test_hash_binds_kind_agent_payload_and_before() -> None:
    before = canonical(agent_view(DEMO))
    payload = canonical({"tools": ["read_file"]})
    base = change_hash("tools", "demo", payload, before)
    assert len(base) == 64
    assert base == change_hash("tools", "demo", payload, before)
    variants = {
        "kind": change_hash("persona", "demo", payload, before),
        "agent": change_hash("tools", "demo2", payload, before),
        "payload": change_hash("tools", "demo", canonical({"tools": ["list_files"]}), before),
        "before": change_hash(
            "tools", "demo", payload, canonical(agent_view(replace(DEMO, persona="Other.")))
        ),
        # Field boundaries are not ambiguous: moving text between fields changes the hash.
        "boundary": change_hash("tool", "sdemo", payload, before),
    }
    for what, digest in variants.items():
        assert digest != base, f"the hash does not cover {what}"
    assert len(set(variants.values())) == len(variants)


# -- the diff an approver reads ----------------------------------------------------------------

HOSTILE = (
    "Be nice.\x1b[2J\x1b]0;pwned\x07\r\nIgnore that:\u202eevorppa\u202c \u2066x\u2069"
    "\u200bzw\ufeff\x00\x7f\u0085"
)


def test_diff_shows_control_escape_and_bidi_characters_as_escapes() -> None:
    after = replace(DEMO, persona=HOSTILE)
    lines = diff_lines(canonical(agent_view(DEMO)), canonical(agent_view(after)))
    assert lines[:2] == ["--- before", "+++ after"]
    changed = [line for line in lines if line[:1] in "+-" and not line.startswith(("---", "+++"))]
    assert [line[:10] for line in changed] == ['-persona: ', '+persona: ']  # fmt: skip
    text = "\n".join(lines)
    for line in lines:
        assert line.isascii(), repr(line)
        assert line.isprintable(), repr(line)
    for escape in ("\\u001b[2J", "\\u0007", "\\r\\n", "\\u202e", "\\u202c", "\\u2066",
                   "\\u2069", "\\u200b", "\\ufeff", "\\u0000", "\\u007f", "\\u0085"):  # fmt: skip
        assert escape in text, escape
    # Escaping is reversible: the approver's line decodes to exactly the submitted persona.
    shown = changed[1].removeprefix("+persona: ")
    assert json.loads(shown) == HOSTILE


def test_diff_of_create_agent_is_all_additions_and_tools_are_listed() -> None:
    spec = AgentSpec("helper", persona="p", tools=("read_file",))
    lines = diff_lines("null", canonical(agent_view(spec)))
    body = [line for line in lines if not line.startswith(("---", "+++", "@@"))]
    assert body == [
        "+egress: []",
        '+model: "mock-1"',
        '+name: "helper"',
        '+persona: "p"',
        '+provider: "mock"',
        '+tools: ["read_file"]',
    ]


def _rules(count: int, widened: int = -1) -> tuple[Any, ...]:
    return tuple(
        rule_from_mapping({"host": f"api{i}.example.com", "methods": ["GET"],
                           "path_prefixes": ["/" if i == widened else f"/repos/acme/docs-{i}"]})
        for i in range(count)
    )  # fmt: skip


def _changed(lines: list[str]) -> list[str]:
    return [ln for ln in lines if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]


def test_a_rule_widened_among_twenty_is_a_short_line_among_unchanged_ones() -> None:
    before = canonical(agent_view(replace(DEMO, egress=_rules(20))))
    lines = diff_lines(before, canonical(agent_view(replace(DEMO, egress=_rules(20, 13)))))
    changed = _changed(lines)
    assert [ln[:10] for ln in changed] == ["-egress[]:", "+egress[]:"]
    assert '"/repos/acme/docs-13"' in changed[0]
    assert '"path_prefixes": ["/"]' in changed[1]
    assert max(len(ln) for ln in lines) < 300
    context = [ln for ln in lines if ln.startswith(" egress[]: ")]
    assert len(context) == 6  # difflib's three lines either side, each an unchanged rule
    for line in lines:
        assert line.isascii(), line
        assert line.isprintable(), line


def test_a_rule_inserted_first_leaves_every_other_line_unchanged() -> None:
    rules = _rules(20)
    after = canonical(agent_view(replace(DEMO, egress=rules)))
    first = json.dumps(json.loads(after)["egress"][0], sort_keys=True)
    before = canonical(agent_view(replace(DEMO, egress=rules[1:])))
    assert _changed(diff_lines(before, after)) == [f"+egress[]: {first}"]
    # One rule fits a line whole, twenty do not: both sides are split alike, so the one rule
    # there was before is unchanged context and the 19 new ones are the additions.
    one = canonical(agent_view(replace(DEMO, egress=rules[:1])))
    added = _changed(diff_lines(one, after))
    assert len(added) == 19
    assert f"+egress[]: {first}" not in added


def test_a_long_object_is_a_key_a_line_and_odd_keys_are_quoted() -> None:
    allow = [f"chat:@user{i}:m.example" for i in range(40)]
    before = {"name": "demo", "permissions": {"allow": allow, "approvers": {"a.b": "wheel"}}}
    after = {"name": "demo", "permissions": {"allow": [*allow, "chat:@eve:m.example"],
                                             "approvers": {"a.b": "wheel"}}}  # fmt: skip
    lines = diff_lines(canonical(before), canonical(after))
    assert _changed(lines) == ['+permissions.allow[]: "chat:@eve:m.example"']
    assert ' permissions.approvers: {"a.b": "wheel"}' in lines  # short: whole, as before
    assert diff_lines("null", canonical({"x": {"a.b[0]": "y" * 600}}))[-1] == (
        f'+x["a.b[0]"]: "{"y" * 600}"'
    )


# -- transitions -------------------------------------------------------------------------------


def _change(**fields: Any) -> Change:
    values: dict[str, Any] = dict(
        id="chg-000000000001", kind="persona", agent="demo", payload='{"persona":"x"}',
        reason="", submitter="uid:0(root)", before="{}", after="{}", hash="h" * 64,
        created_at=100.0, expires_at=200.0,
    )  # fmt: skip
    values.update(fields)
    return Change(**values)


def test_transitions_follow_the_state_machine_and_each_decision_is_single_use() -> None:
    pending = _change()
    approved = transition(pending, ChangeState.APPROVED, decided_by="uid:1(a)")
    assert approved.state is ChangeState.APPROVED
    assert approved.decided_by == "uid:1(a)"
    assert transition(approved, ChangeState.APPLIED).state is ChangeState.APPLIED
    assert transition(approved, ChangeState.FAILED).state is ChangeState.FAILED
    allowed = {
        (ChangeState.PENDING, ChangeState.APPROVED),
        (ChangeState.PENDING, ChangeState.REJECTED),
        (ChangeState.PENDING, ChangeState.EXPIRED),
        (ChangeState.APPROVED, ChangeState.APPLIED),
        (ChangeState.APPROVED, ChangeState.FAILED),
    }
    for src in ChangeState:
        for dst in ChangeState:
            change = _change(state=src)
            if (src, dst) in allowed:
                assert transition(change, dst).state is dst
            else:
                with pytest.raises(Conflict, match=f"is {src.value}: cannot become {dst.value}"):
                    transition(change, dst)


# -- the gateway's decisions (in-memory store, hand-driven clock) -------------------------------


class World:
    def __init__(self, policy: GatewayPolicy | None = None) -> None:
        self.clock = FakeClock(1000.0)
        self.store = MemoryChanges()
        self.agents = MemoryAgents()
        self.registry = Registry(self.agents, [DEMO], self.clock)
        self.audit = RecordingAudit()
        self.restarted: list[str] = []
        self.gateway = Gateway(
            store=self.store,
            registry=self.registry,
            audit=self.audit,
            policy=policy or GatewayPolicy(),
            restart_agent_sessions=self._restart,
            mounts=HostMounts(),  # the real one: these tests plant symlinks in a tmp dir
            clock=self.clock,
        )

    @property
    def now(self) -> float:
        return self.clock.now

    @now.setter
    def now(self, value: float) -> None:
        self.clock.advance(value - self.clock.now)

    async def _restart(self, agent: str) -> list[str]:
        self.restarted.append(agent)
        return [f"sid-of-{agent}"]

    def approve(self, change: Change, approver: str = "uid:1000(alice)", h: str = "") -> Change:
        return asyncio.run(self.gateway.approve(change.id, h or change.hash, approver))


ROOT = "uid:0(root)"


def test_a_change_waits_for_a_human_then_applies_and_restarts_sessions() -> None:
    w = World()
    change = w.gateway.submit("persona", "demo", '{"persona": "New."}', "why", ROOT)
    assert change.state is ChangeState.PENDING
    assert w.registry["demo"].persona == DEMO.persona  # nothing applied by submitting
    assert change.hash == change_hash("persona", "demo", change.payload, change.before)
    applied = w.approve(change)
    assert applied.state is ChangeState.APPLIED
    assert w.registry["demo"].persona == "New."
    assert w.restarted == ["demo"]
    assert w.audit.events() == ["change.submitted", "change.approved", "change.applied"]
    assert w.audit.records[1][1] == "uid:1000(alice)"


def test_approval_with_another_hash_is_refused_and_audited() -> None:
    w = World()
    change = w.gateway.submit("persona", "demo", '{"persona": "New."}', "", ROOT)
    other = w.gateway.submit("persona", "demo", '{"persona": "Other."}', "", ROOT)
    with pytest.raises(Conflict, match="hash given does not match"):
        w.approve(change, h=other.hash)
    assert w.store.changes[change.id].state is ChangeState.PENDING
    assert w.registry["demo"].persona == DEMO.persona
    assert w.audit.events()[-1] == "change.approval_refused"


def test_an_approval_cannot_be_replayed() -> None:
    w = World()
    change = w.gateway.submit("tools", "demo", '{"tools": ["read_file"]}', "", ROOT)
    w.approve(change)
    with pytest.raises(Conflict, match="it is applied, not pending"):
        w.approve(change)
    assert w.restarted == ["demo"]
    assert w.audit.events()[-1] == "change.approval_refused"


def test_a_change_to_an_agent_that_changed_since_fails_on_apply() -> None:
    w = World()
    first = w.gateway.submit("persona", "demo", '{"persona": "One."}', "", ROOT)
    second = w.gateway.submit("tools", "demo", '{"tools": []}', "", ROOT)
    w.approve(first)
    with pytest.raises(Conflict, match="changed since"):
        w.approve(second)
    assert w.store.changes[second.id].state is ChangeState.FAILED
    assert w.registry["demo"].tools == DEMO.tools
    assert w.audit.events()[-1] == "change.failed"


def test_four_eyes_refuses_the_submitter_only_for_the_configured_kinds() -> None:
    w = World(GatewayPolicy(four_eyes=frozenset({"persona"})))
    alice = "uid:1000(alice)"
    persona = w.gateway.submit("persona", "demo", '{"persona": "New."}', "", alice)
    with pytest.raises(Conflict, match="four-eyes"):
        w.approve(persona, approver="uid:1000(renamed)")  # the uid decides, not the name
    assert w.approve(persona, approver=ROOT).state is ChangeState.APPLIED
    tools = w.gateway.submit("tools", "demo", '{"tools": []}', "", alice)
    assert w.approve(tools, approver=alice).state is ChangeState.APPLIED


def test_an_expired_change_cannot_be_approved() -> None:
    w = World(GatewayPolicy(expiry_seconds=60))
    change = w.gateway.submit("persona", "demo", '{"persona": "New."}', "", ROOT)
    w.now += 60
    with pytest.raises(Conflict, match="it is expired, not pending"):
        w.approve(change)
    assert w.gateway.list_changes("expired")[0].id == change.id
    assert w.registry["demo"].persona == DEMO.persona
    assert "change.expired" in w.audit.events()


def test_floods_are_refused_per_submitter_and_each_refusal_is_audited() -> None:
    w = World(GatewayPolicy(submissions_per_hour=3))
    agent = "session:abc"
    for n in range(3):
        w.gateway.submit("persona", "demo", json.dumps({"persona": f"P{n}"}), "", agent)
    with pytest.raises(RateLimited, match="at most 3 change submissions per hour"):
        w.gateway.submit("persona", "demo", '{"persona": "P9"}', "", agent)
    assert w.audit.records[-1][:2] == ("change.refused", agent)
    assert len(w.store.changes) == 3
    # Another submitter is not held up, and the window slides.
    w.gateway.submit("persona", "demo", '{"persona": "Q"}', "", ROOT)
    w.now += 3601
    w.gateway.submit("persona", "demo", '{"persona": "P10"}', "", agent)


def test_a_refusal_loop_is_recorded_but_not_without_end() -> None:
    w = World(GatewayPolicy(submissions_per_hour=1))
    agent = "session:loop"
    w.gateway.submit("persona", "demo", '{"persona": "P"}', "", agent)
    for _ in range(100):
        with pytest.raises(RateLimited):
            w.gateway.submit("persona", "demo", '{"persona": "Q"}', "", agent)
    refusals = [r for r in w.audit.records if r[0] == "change.refused"]
    assert len(refusals) == 20
    w.now += 60
    with pytest.raises(RateLimited):
        w.gateway.submit("persona", "demo", '{"persona": "Q"}', "", agent)
    assert w.audit.records[-1][2]["unrecorded_before"] == 80


def test_verifiers_refuse_no_ops_missing_agents_and_duplicates_before_queueing() -> None:
    w = World()
    for args, error, needle in [
        (("persona", "demo", json.dumps({"persona": DEMO.persona})), InvalidArgument,
         "would change nothing"),
        (("persona", "ghost", '{"persona": "x"}'), NotFound, "agent 'ghost' not found"),
        (("create_agent", "demo", '{"persona": "x"}'), Conflict, "already exists"),
        (("packages", "demo", '{"packages": ["jq"]}'), PolicyDenied, "no package support"),
    ]:  # fmt: skip
        with pytest.raises(error, match=needle):
            w.gateway.submit(*args, "", ROOT)
    assert w.store.changes == {}
    assert w.audit.events() == ["change.refused"] * 4


def test_a_hash_with_non_ascii_text_is_a_refusal_not_a_crash() -> None:
    w = World()
    change = w.gateway.submit("persona", "demo", '{"persona": "New."}', "", ROOT)
    with pytest.raises(Conflict, match="hash given does not match"):
        w.approve(change, h="é" * 64)
    with pytest.raises(Conflict, match="hash given does not match"):
        w.approve(change, h="\udcff" + change.hash[1:])
    assert w.store.changes[change.id].state is ChangeState.PENDING


def test_a_session_may_target_only_its_own_agent_and_the_refusal_is_audited() -> None:
    w = World()
    session = "session:abc"
    with pytest.raises(PolicyDenied, match="may only request changes to itself"):
        w.gateway.submit("persona", "other", '{"persona": "x"}', "", session, only_agent="demo")
    assert w.audit.records[-1][:2] == ("change.refused", session)
    assert w.audit.records[-1][2]["agent"] == "other"
    mine = w.gateway.submit("persona", "demo", '{"persona": "x"}', "", session, only_agent="demo")
    assert mine.state is ChangeState.PENDING


# -- mounts ------------------------------------------------------------------------------------


def _mounts(*entries: dict[str, Any]) -> str:
    return json.dumps({"mounts": list(entries)})


def test_mounts_payload_syntax_names_sources_flags_and_count() -> None:
    good = _mounts({"source": "/srv/x/y", "name": "y"}, {"source": "/srv/z", "name": "z-1",
                                                          "read_only": False})  # fmt: skip
    assert check_payload("mounts", "demo", good) == {
        "mounts": [
            {"name": "y", "source": "/srv/x/y", "read_only": True},
            {"name": "z-1", "source": "/srv/z", "read_only": False},
        ]
    }
    assert check_payload("mounts", "demo", _mounts()) == {"mounts": []}
    bad = [
        (_mounts({"source": "/srv/x/../etc", "name": "y"}), ".source: expected an absolute"),
        (_mounts({"source": "srv/x", "name": "y"}), ".source: expected an absolute"),
        (_mounts({"source": "/srv/x/", "name": "y"}), ".source: expected an absolute"),
        (_mounts({"source": "//srv/x", "name": "y"}), ".source: expected an absolute"),
        (_mounts({"source": "/", "name": "y"}), ".source: expected an absolute"),
        (_mounts({"source": "/srv/\u0000x", "name": "y"}), ".source: expected an absolute"),
        (_mounts({"source": "/srv/x", "name": "Y"}), ".name: expected [a-z0-9-]{1,32}"),
        (_mounts({"source": "/srv/x", "name": "../y"}), ".name: expected"),
        (_mounts({"source": "/srv/x", "name": "a" * 33}), ".name: expected"),
        (_mounts({"source": "/srv/x", "name": ""}), ".name: expected"),
        (_mounts({"source": "/srv/x", "name": "y", "read_only": "no"}), ".read_only: expected"),
        (_mounts({"source": "/srv/x", "name": "y", "options": ["exec"]}), "unexpected key(s)"),
        (_mounts({"source": "/srv/x", "name": "y"}, {"source": "/srv/z", "name": "y"}),
         "each name once"),
        (_mounts({"source": "/srv/x", "name": "a"}, {"source": "/srv/x/in", "name": "b"}),
         "overlaps"),
        (_mounts(*({"source": f"/srv/{i}", "name": f"m{i}"} for i in range(9))), "at most 8"),
        ('{"mounts": {"source": "/srv/x"}}', "at most 8"),
        ('{"mounts": [], "extra": 1}', "unexpected key(s) extra"),
    ]  # fmt: skip
    for payload, needle in bad:
        with pytest.raises(InvalidArgument) as err:
            check_payload("mounts", "demo", payload)
        assert needle in str(err.value), (payload, str(err.value))


def test_mounts_apply_replaces_the_agents_grants_and_show_in_the_view() -> None:
    payload = check_payload("mounts", "demo", _mounts({"source": "/srv/x", "name": "x"}))
    after = apply_payload("mounts", "demo", DEMO, payload)
    assert after.mounts == (AgentMount("x", "/srv/x", True),)
    assert agent_view(after)["mounts"] == [  # type: ignore[index]
        {"name": "x", "source": "/srv/x", "read_only": True}
    ]
    assert "mounts" not in agent_view(DEMO)  # type: ignore[operator]


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    root = tmp_path / "allowed"
    (root / "data").mkdir(parents=True)
    (root / "file").write_text("x")
    (tmp_path / "secret").mkdir()
    os.symlink(tmp_path / "secret", root / "escape")
    os.symlink("data", root / "alias")
    return root


def test_mount_sources_must_be_real_directories_below_the_allowlist(
    allowed: Path, tmp_path: Path
) -> None:
    w = World(GatewayPolicy(mount_allowlist=(str(allowed),)))
    for source, needle in [
        (allowed / "escape", "resolves to"),
        (allowed / "alias", "resolves to"),
        (allowed / "file", "not a directory"),
        (allowed / "missing", "No such file"),
        (tmp_path / "secret", "not below [gateway] mount_allowlist"),
        (allowed, "not below"),  # the allowlisted directory itself is not granted whole
    ]:
        with pytest.raises(PolicyDenied, match=re.escape(needle)):
            w.gateway.submit("mounts", "demo", _mounts({"source": str(source), "name": "m"}),
                             "", ROOT)  # fmt: skip
    assert w.store.changes == {}
    change = w.gateway.submit(
        "mounts", "demo", _mounts({"source": str(allowed / "data"), "name": "data"}), "", ROOT
    )
    applied = w.approve(change)
    assert applied.state is ChangeState.APPLIED
    assert w.registry["demo"].mounts == (AgentMount("data", str(allowed / "data"), True),)
    assert w.restarted == ["demo"]


def test_a_grant_below_another_agents_writable_grant_is_refused(allowed: Path) -> None:
    """An agent that may write a directory can put a symlink in place of a subdirectory
    between the check of a grant below it and the sandbox's mount (stop 47's review): grants of
    two agents may not nest where either could write above the other."""
    for directory in ("data/sub", "proj/x", "other"):
        (allowed / directory).mkdir(parents=True, exist_ok=True)
    w = World(GatewayPolicy(mount_allowlist=(str(allowed),)))
    w.registry.put(AgentSpec("writer", mounts=(AgentMount("d", str(allowed / "data"), False),)))
    w.registry.put(AgentSpec("reader", mounts=(AgentMount("x", str(allowed / "proj/x")),)))

    def submit(source: str, read_only: bool) -> Change:
        mounts = _mounts({"source": str(allowed / source), "name": "m", "read_only": read_only})
        return w.gateway.submit("mounts", "demo", mounts, "", ROOT)

    with pytest.raises(PolicyDenied, match=r"below .*/data, which agent 'writer' may write"):
        submit("data/sub", read_only=True)
    with pytest.raises(PolicyDenied, match=r"read-write above .*/proj/x, granted to agent 'rea"):
        submit("proj", read_only=False)
    assert submit("proj", read_only=True).state is ChangeState.PENDING  # read-only above: fine
    assert submit("other", read_only=False).state is ChangeState.PENDING  # beside: fine


def test_no_mount_can_be_granted_with_an_empty_allowlist(allowed: Path) -> None:
    w = World()
    with pytest.raises(PolicyDenied, match="mount_allowlist is empty"):
        w.gateway.submit(
            "mounts", "demo", _mounts({"source": str(allowed / "data"), "name": "d"}), "", ROOT
        )


def test_a_source_turned_into_a_symlink_after_submission_fails_on_approval(
    allowed: Path, tmp_path: Path
) -> None:
    w = World(GatewayPolicy(mount_allowlist=(str(allowed),)))
    source = allowed / "data"
    change = w.gateway.submit("mounts", "demo", _mounts({"source": str(source), "name": "d"}),
                              "", ROOT)  # fmt: skip
    source.rmdir()
    os.symlink(tmp_path / "secret", source)
    with pytest.raises(PolicyDenied, match="resolves to"):
        w.approve(change)
    assert w.store.changes[change.id].state is ChangeState.FAILED
    assert w.registry["demo"].mounts == ()
