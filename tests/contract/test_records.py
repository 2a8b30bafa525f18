"""The records ports (``ironclawd.ports.records``): the in-memory fakes and the SQLCipher state
DB (store/state.py, on a real file in a tmp dir) keep, return and refuse the same things."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ironclawd.domain.changes import Change, ChangeState
from ironclawd.domain.messages import GENESIS, Reply
from ironclawd.domain.reply_bounds import ReplyUsage
from ironclawd.domain.session import Session, State
from ironclawd.errors import AlreadyExists, IronclawError, NotFound
from ironclawd.store.state import StateStore
from tests.fakes import (
    MemoryAgents,
    MemoryAuditHead,
    MemoryChanges,
    MemoryReplies,
    MemorySessionKeys,
    MemorySessions,
)

KEY = bytes(range(32))


@pytest.fixture(params=["fake", "sqlcipher"])
def records(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Each records port by name: six fakes, or one StateStore serving all six."""
    if request.param == "fake":
        replies = MemoryReplies()
        yield {
            "sessions": MemorySessions(), "replies": replies,
            "keys": MemorySessionKeys(replies), "agents": MemoryAgents(),
            "changes": MemoryChanges(), "audit_head": MemoryAuditHead(),
        }  # fmt: skip
        return
    store = StateStore(tmp_path / "state.db", KEY)
    try:
        yield dict.fromkeys(("sessions", "replies", "keys", "agents", "changes", "audit_head"),
                            store)  # fmt: skip
    finally:
        store.close()


def _session(sid: str, created: float = 1.0) -> Session:
    return Session(sid, "demo", State.CREATING, created, created, created)


def test_sessions_insert_get_save_list_delete(records: dict[str, Any]) -> None:
    store = records["sessions"]
    first, second = _session("aaaaaaaaaaaa", 2.0), _session("bbbbbbbbbbbb", 1.0)
    store.insert(first)
    store.insert(second)
    with pytest.raises(AlreadyExists):
        store.insert(first)
    assert store.get(first.sid) == first
    running = replace(first, state=State.RUNNING, updated_at=3.0, platform="ptrace", error="e")
    store.save(running)
    assert store.get(first.sid) == running
    assert [s.sid for s in store.list_sessions()] == [second.sid, first.sid]  # by created_at
    store.delete(first.sid)
    store.delete(first.sid)  # idempotent
    with pytest.raises(NotFound):
        store.get(first.sid)
    with pytest.raises(NotFound):
        store.save(running)


def test_replies_in_order_after_a_seq_with_limit(records: dict[str, Any]) -> None:
    store = records["replies"]
    assert store.last_reply("s") == (0, GENESIS)
    rows = [Reply(n, n, float(n), f"body {n}", bytes([n]) * 32) for n in (1, 2, 3)]
    store.add_replies("s", rows)
    assert store.last_reply("s") == (3, bytes([3]) * 32)
    assert store.replies_after("s", 1) == rows[1:]
    assert store.replies_after("s", 0, limit=2) == rows[:2]
    assert store.replies_after("other", 0) == []


def test_what_a_sessions_replies_take_is_kept_with_them(records: dict[str, Any]) -> None:
    store, keys = records["replies"], records["keys"]
    assert store.reply_usage("s") == ReplyUsage()
    store.add_replies("s", [Reply(1, 1, 1.0, "x", bytes(32))], ReplyUsage(169, 1, 1))
    store.add_replies("s", [Reply(2, 1, 1.0, "y", bytes(32))], ReplyUsage(338, 1, 2))
    assert (store.reply_usage("s"), store.reply_usage("other")) == (ReplyUsage(338, 1, 2),
                                                                    ReplyUsage())  # fmt: skip
    with pytest.raises(IronclawError):  # refused whole: what they take is not changed either
        store.add_replies("s", [Reply(2, 1, 1.0, "y", bytes(32))], ReplyUsage(507, 1, 3))
    assert store.reply_usage("s") == ReplyUsage(338, 1, 2)
    keys.destroy_session_data("s")
    assert store.reply_usage("s") == ReplyUsage()


def test_the_pruned_seq_only_grows_and_is_per_session(records: dict[str, Any]) -> None:
    store = records["replies"]
    assert store.pruned("s") == 0
    store.set_pruned("s", 256)
    store.set_pruned("s", 100)  # an older announcement never lowers it
    store.set_pruned("other", 5)
    assert (store.pruned("s"), store.pruned("other")) == (256, 5)


def test_session_keys_are_forgotten_with_the_replies(records: dict[str, Any]) -> None:
    keys, replies = records["keys"], records["replies"]
    assert keys.wrapped_key("s") is None
    keys.put_wrapped_key("s", b"wrapped")
    keys.put_wrapped_key("s", b"again")  # replaced
    assert keys.wrapped_key("s") == b"again"
    replies.add_replies("s", [Reply(1, 1, 1.0, "x", bytes(32))])
    replies.set_pruned("s", 1)
    keys.destroy_session_data("s")
    assert keys.wrapped_key("s") is None
    assert replies.replies_after("s", 0) == []
    assert replies.pruned("s") == 0
    # A late record for the removed session does not carry over to a new one of the same id.
    replies.set_pruned("s", 7)
    keys.put_wrapped_key("s", b"new session")
    assert replies.pruned("s") == 0


def test_a_sessions_senders_last_its_life_and_go_with_its_data(records: dict[str, Any]) -> None:
    replies, keys = records["replies"], records["keys"]
    assert replies.senders("s") == frozenset()
    replies.add_sender("s", "uid:1000(alice)")
    replies.add_sender("s", "uid:1000(alice)")  # once
    replies.add_sender("s", "uid:1001(bob)")
    replies.add_sender("t", "uid:1002(carol)")
    assert replies.senders("s") == {"uid:1000(alice)", "uid:1001(bob)"}
    keys.destroy_session_data("s")
    assert replies.senders("s") == frozenset()
    assert replies.senders("t") == {"uid:1002(carol)"}
    keys.put_wrapped_key("t", b"a new session of the id")  # nothing carries over
    assert replies.senders("t") == frozenset()


def test_agents_are_replaced_by_name(records: dict[str, Any]) -> None:
    agents = records["agents"]
    assert agents.agents() == {}
    agents.put_agent("b", '{"v": 1}', 1.0)
    agents.put_agent("a", '{"v": 1}', 1.0)
    agents.put_agent("b", '{"v": 2}', 2.0)
    assert agents.agents() == {"a": '{"v": 1}', "b": '{"v": 2}'}


def _change(cid: str, created: float, submitter: str = "uid:0(root)") -> Change:
    return Change(
        id=cid, kind="persona", agent="demo", payload='{"persona": "x"}', reason="",
        submitter=submitter, before="{}", after='{"persona": "x"}', hash="h" * 64,
        created_at=created, expires_at=created + 60,
    )  # fmt: skip


def test_changes_save_only_the_decision(records: dict[str, Any]) -> None:
    store = records["changes"]
    first, second = _change("c2", 2.0), _change("c1", 1.0, "uid:1000(alice)")
    store.insert_change(first)
    store.insert_change(second)
    decided = replace(first, state=ChangeState.APPROVED, decided_by="alice", decided_at=3.0,
                      note="ok", payload="IGNORED")  # fmt: skip
    store.save_change(decided)
    assert store.get_change("c2") == replace(decided, payload=first.payload)
    assert [c.id for c in store.list_changes()] == ["c1", "c2"]
    assert [c.id for c in store.list_changes("approved")] == ["c2"]
    assert store.count_changes_since("uid:0(root)", 2.0) == 1
    assert store.count_changes_since("uid:0(root)", 2.5) == 0
    with pytest.raises(NotFound):
        store.get_change("nope")


def test_changes_are_listed_a_page_at_a_time(records: dict[str, Any]) -> None:
    store = records["changes"]
    big = "é" * 1000  # 2000 bytes of UTF-8 in `after`
    kept = [replace(_change(f"c{n}", float(n // 2)), after=big) for n in range(7)]
    for change in reversed(kept):  # the order is by creation, not by insertion
        store.insert_change(change)
    store.save_change(replace(kept[3], state=ChangeState.REJECTED))
    kept[3] = store.get_change("c3")
    assert store.list_changes_page(None, "", 2, 10**6) == (kept[:2], True)
    assert store.list_changes_page(None, "c1", 2, 10**6) == (kept[2:4], True)
    assert store.list_changes_page(None, "c5", 2, 10**6) == (kept[6:], False)
    assert store.list_changes_page(None, "c6", 2, 10**6) == ([], False)
    # The same created_at: by id.
    assert store.list_changes_page(None, "c4", 1, 10**6) == ([kept[5]], True)
    # A page ends before its payload, before and after pass max_bytes, one change at least.
    each = 2000 + len('{"persona": "x"}') + len("{}")
    assert store.list_changes_page(None, "", 9, 3 * each) == (kept[:3], True)
    assert store.list_changes_page(None, "", 9, 3 * each - 1) == (kept[:2], True)
    assert store.list_changes_page(None, "", 9, 1) == (kept[:1], True)
    assert store.list_changes_page("pending", "c2", 9, 10**6) == (kept[4:], False)
    assert store.list_changes_page("rejected", "", 9, 10**6) == ([kept[3]], False)
    with pytest.raises(NotFound, match="change nope not found"):
        store.list_changes_page(None, "nope", 2, 10**6)


def test_a_changes_session_senders_are_kept_and_not_decided(records: dict[str, Any]) -> None:
    store = records["changes"]
    change = replace(_change("c1", 1.0, "session:s1"), drivers=("uid:1000(alice)", "uid:1(b)"))
    store.insert_change(change)
    store.save_change(replace(change, state=ChangeState.REJECTED, drivers=()))
    assert store.get_change("c1").drivers == ("uid:1000(alice)", "uid:1(b)")
    assert store.list_changes()[0].drivers == ("uid:1000(alice)", "uid:1(b)")


def test_audit_head_is_the_newest_set(records: dict[str, Any]) -> None:
    head = records["audit_head"]
    assert head.audit_head() is None
    head.set_audit_head(1, "a" * 64)
    head.set_audit_head(3, "c" * 64)
    assert head.audit_head() == (3, "c" * 64)
    # Saved late by another thread, an older head never replaces a newer one (stop 47's
    # review: a cut of the newest records then went unnoticed at the next verify).
    head.set_audit_head(2, "b" * 64)
    assert head.audit_head() == (3, "c" * 64)
