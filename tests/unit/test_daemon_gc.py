"""The daemon freezes what it imported and wired (``daemon._freeze_long_lived``): a later full
collection walks only what was made since, not the ~50,000 objects of the start (issue 17:
a full collection had stalled the event loop 18-39 ms)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from ironclawd import daemon


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test run collects as usual


@pytest.mark.usefixtures("unfrozen")
def test_what_exists_at_the_freeze_is_left_out_of_later_collections() -> None:
    tracked = len(gc.get_objects())
    daemon._freeze_long_lived()
    assert gc.get_freeze_count() >= tracked * 0.9  # a few objects die meanwhile
    made_after = [[n] for n in range(1000)]  # tracked containers, made after the freeze
    in_collections = gc.get_objects()
    assert len(in_collections) < tracked / 2
    assert any(o is made_after[0] for o in in_collections)
