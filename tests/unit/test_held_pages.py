"""Held messages are listed a page at a time: 1,000 a channel of up to 16 KiB each passed
gRPC's 4 MiB answer from about three full channels, and `ironctl channel held` then failed
(found by a review). The daemon answers pages under 3 MiB of text; ironctl reads them all."""

from __future__ import annotations

import asyncio
import io
import json
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.api.admin_channels import HELD_PAGE_MAX, ChannelsMixin
from ironclawd.ctl import exitcodes, rpc
from ironclawd.ctl.main import main
from ironclawd.errors import InvalidArgument
from ironclawd.ports.channel_records import HeldMessage
from tests.fakes.channels import MemoryChannelRecords
from tests.unit import ctl_world as world

TEXT = "x" * 16 * 1024  # the largest text a channel message may hold


def _servicer(count: int) -> ChannelsMixin:
    records = MemoryChannelRecords()
    for n in range(count):
        held = HeldMessage(0, f"ch{n % 4}", "!r", "@eve", f"${n}", "", TEXT, False, 5.0)
        assert records.hold(held, 10_000, 10**9) is not None
    servicer = ChannelsMixin()
    servicer._inbox = SimpleNamespace(held=records.held, route=lambda c, w: None)  # type: ignore[assignment]
    return servicer


def _list(servicer: ChannelsMixin, **request: Any) -> admin_pb2.ListHeldResponse:
    call = servicer.ListHeld(admin_pb2.ListHeldRequest(**request), None)  # type: ignore[arg-type]
    return asyncio.run(call)


def test_the_daemon_answers_pages_that_fit_and_lists_every_message_once() -> None:
    servicer = _servicer(1000)
    seen: list[str] = []
    after, pages = 0, 0
    while True:
        page = _list(servicer, after_id=after, limit=HELD_PAGE_MAX)
        assert page.ByteSize() < 3.5 * 1024 * 1024
        seen.extend(h.event_id for h in page.held)
        pages += 1
        after = page.next_after_id
        if not after:
            break
    assert seen == [f"${n}" for n in range(1000)]
    assert pages >= 6  # ~190 of 16 KiB to a page
    # The default page is 200 at most; an empty list is one page.
    assert len(_list(servicer).held) <= 200
    assert _list(_servicer(0)) == admin_pb2.ListHeldResponse()


def test_a_page_larger_than_the_daemon_allows_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgument, match=f"limit: expected at most {HELD_PAGE_MAX}"):
        _list(_servicer(1), limit=HELD_PAGE_MAX + 1)
    assert _list(_servicer(3), after_id=2**64 - 1).held == []


def test_ironctl_reads_every_page(monkeypatch: pytest.MonkeyPatch) -> None:
    servicer = _servicer(450)

    def pages(self: object, request: admin_pb2.ListHeldRequest, **_: Any) -> Any:
        return _list(servicer, after_id=request.after_id)

    monkeypatch.setattr(rpc, "stub_for", world.Stub)
    monkeypatch.setattr(world.Stub, "ListHeld", pages)
    out = io.StringIO()
    real, sys.stdout = sys.stdout, out
    try:
        code = main(["--json", "channel", "held"])
    finally:
        sys.stdout = real
    assert code == exitcodes.OK
    shown = json.loads(out.getvalue())
    assert [h["event_id"] for h in shown["held"]] == [f"${n}" for n in range(450)]
    assert set(shown) == {"held"}  # the pages are the daemon's business
