"""Redaction and budgets of the model proxy (ironclawd/domain/model.py): pure rules.

Redaction must hold wherever the upstream splits its stream, so the properties are checked at
every chunk boundary (exhaustively for two and three chunks of a fixed text, and by hypothesis
for any number of chunks of any text).
"""

from __future__ import annotations

import itertools
import json
import random
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ironclawd.domain.model import Budget, Redactor, ToolDef, enabled_tools
from ironclawd.domain.tools import CATALOG
from ironclawd.errors import BudgetExceeded

SECRET = "sk-ant-CANARY-0123456789abcdef"
OTHER = "sk-other-77"


def _stream(redactor: Redactor, chunks: list[str]) -> str:
    return "".join(redactor.feed(c) for c in chunks) + redactor.flush()


def _split(text: str, cuts: tuple[int, ...]) -> list[str]:
    bounds = [0, *sorted(cuts), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


# -- Redactor --------------------------------------------------------------------------------


def test_scrub_masks_every_occurrence_and_leaves_the_rest() -> None:
    r = Redactor([SECRET])
    text = f"key={SECRET}; again {SECRET}."
    assert r.scrub(text) == "key=[REDACTED]; again [REDACTED]."


def test_secret_split_at_every_two_and_three_chunk_boundary_never_passes() -> None:
    text = f"before {SECRET} middle {SECRET}after"
    expected = f"before {Redactor.MASK} middle {Redactor.MASK}after"
    for n in (1, 2):
        for cuts in itertools.combinations(range(1, len(text)), n):
            out = _stream(Redactor([SECRET]), _split(text, cuts))
            assert out == expected, cuts


def test_one_character_chunks_and_empty_chunks() -> None:
    text = f"x{SECRET}y"
    chunks = [c for ch in text for c in (ch, "")]
    assert _stream(Redactor([SECRET]), chunks) == f"x{Redactor.MASK}y"


def test_text_is_held_back_only_as_long_as_a_secret_could_still_be_forming() -> None:
    r = Redactor([SECRET])
    head = "a" * 100
    assert r.feed(head) == head[: 100 - (len(SECRET) - 1)]
    assert r.flush() == head[100 - (len(SECRET) - 1) :]
    # No secrets: nothing is held back at all.
    assert Redactor([]).feed("abc") == "abc"
    assert Redactor(["", "abc"]).feed("xyz") == "xyz"  # shorter than 4: ignored


@given(
    before=st.text(max_size=40),
    after=st.text(max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12),
)
def test_any_split_of_any_text_streams_exactly_the_scrubbed_text(
    before: str, after: str, cuts: list[int]
) -> None:
    text = before + SECRET + after
    chunks = _split(text, tuple(min(c, len(text)) for c in cuts))
    r = Redactor([SECRET])
    out = _stream(r, chunks)
    assert SECRET not in out
    assert out == Redactor([SECRET]).scrub(text)


@given(
    parts=st.lists(st.sampled_from([SECRET, OTHER, "x", " ", "sk-", SECRET[:7]]), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_several_secrets_of_different_lengths(parts: list[str], cuts: list[int]) -> None:
    text = "".join(parts)
    out = _stream(Redactor([SECRET, OTHER]), _split(text, tuple(min(c, len(text)) for c in cuts)))
    assert SECRET not in out
    assert OTHER not in out
    assert out.count(Redactor.MASK) == text.count(SECRET) + text.count(OTHER)


def test_scrub_json_catches_secrets_spelled_with_escapes() -> None:
    r = Redactor([SECRET])
    escaped = "".join(f"\\u{ord(c):04x}" for c in SECRET)
    for raw in (
        json.dumps({"content": SECRET}),
        '{"content": "' + escaped + '"}',
        '{"content": "' + SECRET.replace("-", "\\u002d") + '"}',
        json.dumps({SECRET: [1, {"deep": ["x" + SECRET + "y"]}]}),
    ):
        cleaned = r.scrub_json(raw)
        assert SECRET not in json.dumps(json.loads(cleaned), ensure_ascii=False), raw
        assert Redactor.MASK in cleaned
    # Without a secret the text is returned as it was; with one, escapes stay escapes (a lone
    # surrogate decoded and written back raw could not be sent in a protobuf string).
    plain = '{"path": "\\udcff",   "n": 1}'
    assert r.scrub_json(plain) == plain
    mixed = r.scrub_json('{"path": "\\udcff", "c": "' + SECRET + '"}')
    mixed.encode("utf-8")
    assert json.loads(mixed) == {"path": "\udcff", "c": Redactor.MASK}
    # Not JSON: scrubbed as text; numbers and the rest keep their values.
    assert r.scrub_json("{" + SECRET) == "{" + Redactor.MASK
    assert json.loads(r.scrub_json('{"n": 1.5, "b": true, "z": null}')) == {
        "n": 1.5,
        "b": True,
        "z": None,
    }


def test_scrub_json_of_json_nested_past_the_walk_is_an_answer_not_a_crash() -> None:
    """json.loads takes nesting the recursive walk cannot: a RecursionError failed an MCP call
    (an echo of one flat string the box sent) as an internal error each time (found by a
    review). Without escapes the text is scrubbed as text; with them, nothing of it is kept."""
    r = Redactor([SECRET])
    depth = sys.getrecursionlimit() - 50
    nested = "[" * depth + '"' + SECRET + '"' + "]" * depth
    json.loads(nested)  # the parser takes it
    assert r.scrub_json(nested) == "[" * depth + '"' + Redactor.MASK + '"' + "]" * depth
    escaped = "[" * depth + '"' + SECRET.replace("-", "\\u002d") + '"' + "]" * depth
    assert r.scrub_json(escaped) == json.dumps(Redactor.MASK)
    # With no secret to mask, nothing is parsed at all.
    assert Redactor([]).scrub_json(escaped) == escaped


# -- Budget ----------------------------------------------------------------------------------


def test_requests_per_minute_is_a_sliding_window() -> None:
    b = Budget(requests_per_minute=2, tokens_per_day=10**9)
    b.admit(1000.0, "session s")
    b.admit(1030.0, "session s")
    with pytest.raises(BudgetExceeded, match="session s: rate limit of 2 model requests"):
        b.admit(1059.9, "session s")
    b.admit(1060.0, "session s")  # the first one left the window
    with pytest.raises(BudgetExceeded):
        b.admit(1089.9, "session s")
    b.admit(1090.0, "session s")


def test_a_refused_request_is_not_counted() -> None:
    b = Budget(requests_per_minute=1, tokens_per_day=10**9)
    b.admit(0.0, "x")
    for t in (1.0, 2.0, 59.0):
        with pytest.raises(BudgetExceeded):
            b.admit(t, "x")
    b.admit(60.0, "x")


def test_check_does_not_count_record_does() -> None:
    b = Budget(requests_per_minute=1, tokens_per_day=10**9)
    for _ in range(5):
        b.check(0.0, "x")
    b.record(0.0)
    with pytest.raises(BudgetExceeded):
        b.check(0.0, "x")


def test_tokens_per_day_window() -> None:
    b = Budget(requests_per_minute=1000, tokens_per_day=100)
    b.admit(0.0, "agent a")
    b.spend(0.0, 60)
    b.admit(10.0, "agent a")  # 60 used: still under
    b.spend(10.0, 50)
    with pytest.raises(
        BudgetExceeded, match=r"agent a: daily budget of 100 tokens used up \(110\)"
    ):
        b.admit(20.0, "agent a")
    with pytest.raises(BudgetExceeded):
        b.admit(86399.0, "agent a")
    b.admit(86400.0, "agent a")  # the first spend left the day: 50 used
    b.spend(86400.0, 60)
    with pytest.raises(BudgetExceeded, match=r"\(110\)"):
        b.admit(86405.0, "agent a")
    b.admit(86410.0, "agent a")  # the second spend (t=10) left too: 60 used


def test_tokens_used_is_the_sum_of_the_day_as_it_slides() -> None:
    """The running total (kept instead of summing a day of records on every call) is always
    what was spent in the last 24 hours."""
    rng = random.Random(17)
    b = Budget(requests_per_minute=10**9, tokens_per_day=10**12)
    spent: list[tuple[float, int]] = []
    now = 0.0
    for _ in range(3000):
        now += rng.choice((0.5, 60.0, 3600.0, 40000.0))
        n = rng.randrange(0, 5000)
        b.spend(now, n)
        spent.append((now, n))
        b.check(now, "x")
        assert b._used == sum(k for t, k in spent if t > now - 86400)


# -- the tools sent upstream -------------------------------------------------------------------


def test_each_enabled_tool_is_sent_once_in_the_order_first_offered() -> None:
    """10,000 copies of a tool's name (a 130 KB request) were 10,000 host definitions upstream."""
    host = (CATALOG["read_file"], CATALOG["write_file"], CATALOG["list_files"])
    offered = [ToolDef("write_file", "", "")] * 10_000 + [
        ToolDef("read_file", "", ""),
        ToolDef("http_fetch", "", ""),  # not enabled for it
        ToolDef("write_file", "", ""),
    ]
    assert enabled_tools(offered, host) == (CATALOG["write_file"], CATALOG["read_file"])
