"""Changes are listed a page at a time, and a change too large for an answer is shown abridged.

ListChanges answered every change there ever was in one message, each with its payload, before,
after and diff, and changes are never deleted: one session egress submission of 1.4 MB took the
answer past the admin socket's 4 MiB, and `ironctl change list` failed from then on (found by a
review). The daemon now answers pages that end before 3 MiB; ironctl reads them all and prints
the same {"changes": [...]} as before. A change stored before submissions were bounded, too
large for any answer, is listed, shown and rejected without its payload, before and after, and
with a diff of one line saying so; it cannot be approved, as nobody was shown it whole."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import sys
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.api import auth
from ironclawd.api.admin_changes import CHANGES_PAGE_MAX, ChangesMixin
from ironclawd.api.peer import Caller
from ironclawd.ctl import exitcodes, rpc
from ironclawd.ctl.main import main
from ironclawd.ctl.shapes import to_dict
from ironclawd.domain.changes import Change, ChangeState, agent_view, canonical, change_hash
from ironclawd.domain.egress import EgressRule
from ironclawd.errors import Conflict, InvalidArgument, NotFound
from tests.unit import ctl_world as world
from tests.unit.test_changes_domain import DEMO, World

ANSWER = 4 * 1024 * 1024  # [admin] max_message_bytes default (config.py)
ROOT = Caller(0, 0, 43, (0,), "root", True)
LONG = "/" + "a" * 1_400_000


def _old_egress_change(cid: str = "chg-old", created: float = 999.0) -> Change:
    """The reviewer's change, as a daemon without the bounds stored it: one path prefix of
    1.4 MB, shown in the payload, in `after` and in the diff: over 4 MiB in all."""
    rule = EgressRule("example.org", path_prefixes=(LONG,))
    payload = canonical({"rules": [{**dataclasses.asdict(rule), "methods": ["GET"],
                                    "path_prefixes": [LONG]}]})  # fmt: skip
    before = canonical(agent_view(DEMO))
    after = canonical(agent_view(dataclasses.replace(DEMO, egress=(rule,))))
    digest = change_hash("egress", "demo", payload, before)
    return Change(cid, "egress", "demo", payload, "", "session:s1", before, after, digest,
                  created, created + 10**6)  # fmt: skip


def _filler(n: int, size: int = 10, created: float = 1000.0) -> Change:
    persona = canonical({"persona": "p" * size})
    return Change(f"chg-{n:04}", "persona", "demo", persona, "", "uid:0(root)", "{}", persona,
                  "h" * 64, created + n, created + n + 10**6)  # fmt: skip


def _world(*changes: Change) -> tuple[World, ChangesMixin]:
    w = World()
    for change in changes:
        w.store.insert_change(change)
    servicer = ChangesMixin()
    servicer._gateway = w.gateway
    servicer._audit_trail = w.audit  # type: ignore[assignment]
    return w, servicer


def _call(method: Any, request: Any) -> Any:
    async def go() -> Any:
        auth._CALLER.set(ROOT)
        return await method(request, None)

    return asyncio.run(go())


def _pages(servicer: ChangesMixin, **request: Any) -> list[admin_pb2.ListChangesResponse]:
    pages, after = [], ""
    while True:
        list_request = admin_pb2.ListChangesRequest(after_id=after, **request)
        page = _call(servicer.ListChanges, list_request)
        assert page.ByteSize() < 3.6 * 1024 * 1024  # under the answer's 4 MiB
        pages.append(page)
        after = page.next_after_id
        if not after:
            return pages


def test_every_page_fits_an_answer_and_every_change_is_listed_once_in_order() -> None:
    big = [_filler(n, size=900_000) for n in range(8)]  # 2.7 MB shown: payload, after, diff
    small = [_filler(n, created=5000.0) for n in range(1000, 1250)]
    _, servicer = _world(_old_egress_change(), *big, *small)
    pages = _pages(servicer)
    seen = [c.id for page in pages for c in page.changes]
    assert seen == ["chg-old"] + [c.id for c in big] + [c.id for c in small]
    assert len(pages) == 8 + 3  # a big one a page (the abridged one with the first), then 100
    assert max(len(p.changes) for p in pages) == 100  # the default page
    (old,) = pages[0].changes
    assert old.payload_json == old.before_json == old.after_json == ""
    assert len(old.diff) == 1
    assert old.diff[0].startswith("(not shown: change chg-old takes ")
    assert old.hash
    assert old.state == "pending"
    assert old.submitter == "session:s1"


def test_a_page_larger_than_the_daemon_allows_is_refused_and_after_id_names_a_change() -> None:
    _, servicer = _world(*[_filler(n) for n in range(3)])
    with pytest.raises(InvalidArgument, match=f"limit: expected at most {CHANGES_PAGE_MAX}"):
        _call(servicer.ListChanges, admin_pb2.ListChangesRequest(limit=CHANGES_PAGE_MAX + 1))
    with pytest.raises(NotFound, match="change chg-nope not found"):
        _call(servicer.ListChanges, admin_pb2.ListChangesRequest(after_id="chg-nope"))
    page = _call(servicer.ListChanges, admin_pb2.ListChangesRequest(limit=2))
    assert [c.id for c in page.changes] == ["chg-0000", "chg-0001"]
    assert page.next_after_id == "chg-0001"
    empty = _call(servicer.ListChanges, admin_pb2.ListChangesRequest(after_id="chg-0002"))
    assert empty == admin_pb2.ListChangesResponse()


def test_a_state_is_listed_across_pages_with_the_changes_expired_meanwhile() -> None:
    w, servicer = _world(*[_filler(n) for n in range(7)])
    for n in (1, 2, 5):  # past their expiry, still stored as pending
        w.store.changes[f"chg-{n:04}"] = dataclasses.replace(
            w.store.changes[f"chg-{n:04}"], expires_at=w.now - 1
        )
    w.store.save_change(dataclasses.replace(w.store.changes["chg-0003"],
                                            state=ChangeState.REJECTED))  # fmt: skip

    def ids(state: str) -> list[str]:
        pages = _pages(servicer, state=state, limit=2)
        return [c.id for page in pages for c in page.changes]

    assert ids("expired") == ["chg-0001", "chg-0002", "chg-0005"]
    assert ids("pending") == ["chg-0000", "chg-0004", "chg-0006"]
    assert ids("rejected") == ["chg-0003"]
    with pytest.raises(InvalidArgument, match="state: expected one of"):
        ids("bogus")


def test_a_change_too_large_to_show_is_shown_abridged_and_can_be_rejected_not_approved() -> None:
    w, servicer = _world(_old_egress_change())
    shown = _call(servicer.GetChange, admin_pb2.GetChangeRequest(id="chg-old"))
    assert shown.ByteSize() < ANSWER
    (line,) = shown.change.diff
    assert "takes " in line
    assert "it can be rejected, not approved" in line
    request = admin_pb2.ApproveChangeRequest(id="chg-old", hash=shown.change.hash)
    with pytest.raises(Conflict, match=r"cannot approve chg-old: it takes \d+ bytes, over the"):
        _call(servicer.ApproveChange, request)
    assert w.audit.events()[-1] == "change.approval_refused"
    assert w.store.get_change("chg-old").state is ChangeState.PENDING
    rejected = _call(servicer.RejectChange, admin_pb2.RejectChangeRequest(id="chg-old"))
    assert rejected.ByteSize() < ANSWER
    assert rejected.change.state == "rejected"


def test_a_change_that_fits_is_shown_whole() -> None:
    _, servicer = _world(_filler(0, size=1_200_000))  # 3.6 MB shown
    shown = _call(servicer.GetChange, admin_pb2.GetChangeRequest(id="chg-0000")).change
    assert shown.payload_json == shown.after_json == canonical({"persona": "p" * 1_200_000})
    assert shown.diff[-1] == "+persona: " + json.dumps("p" * 1_200_000)


def test_ironctl_reads_every_page_and_prints_the_shape_it_always_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, servicer = _world(_old_egress_change(), *[_filler(n) for n in range(230)])
    asked: list[str] = []

    def pages(self: object, request: admin_pb2.ListChangesRequest, **_: Any) -> Any:
        asked.append(request.state)
        return _call(servicer.ListChanges, request)

    monkeypatch.setattr(rpc, "stub_for", world.Stub)
    monkeypatch.setattr(world.Stub, "ListChanges", pages)
    for verb in ("list", "pending"):
        out = io.StringIO()
        real, sys.stdout = sys.stdout, out
        try:
            code = main(["--json", "change", verb])
        finally:
            sys.stdout = real
        assert code == exitcodes.OK
        shown = json.loads(out.getvalue())
        assert set(shown) == {"changes"}  # the pages are the daemon's business
        assert [c["id"] for c in shown["changes"]] == ["chg-old"] + [
            f"chg-{n:04}" for n in range(230)
        ]
        assert set(shown["changes"][1]) == set(to_dict(world.CHANGE))
    assert asked == [""] * 3 + ["pending"] * 3  # 231 changes: three pages each
