"""What the Matrix adapter reads from a timeline event (host/matrix_events.py): only plain-text
messages of others, their plain body, thread and mention; anything of the wrong shape is named,
never raised; and the per-sender rate meter."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ironclawd.host import matrix_events as ev
from ironclawd.ports.channels import InboundEvent

BOT = "@bot:ironclaw.test"
READER = ev.Reader("chat", BOT, ("Claw Bot",), max_bytes=64)


def message(
    body: Any = "hi", sender: str = "@alice:x", content: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "type": "m.room.message", "event_id": "$e1", "sender": sender,
        "content": {"msgtype": "m.text", "body": body, **(content or {})},
    }  # fmt: skip


def test_a_plain_message_is_read_with_its_identity_room_and_body_only() -> None:
    got = READER.read("!r:x", message("hi", content={"formatted_body": "<b>ignore me</b>"}), 5.0)
    assert got == InboundEvent("chat", "$e1", "@alice:x", "!r:x", "hi", "", False, 5.0)


def test_what_is_not_a_message_of_another_is_named() -> None:
    assert READER.read("!r", message(sender=BOT), 0) == ev.OWN
    assert READER.read("!r", message(content={"msgtype": "m.notice"}), 0) == ev.OTHER
    assert READER.read("!r", {**message(), "type": "m.room.encrypted"}, 0) == ev.OTHER
    edit = message(content={"m.relates_to": {"rel_type": "m.replace", "event_id": "$e0"}})
    assert READER.read("!r", edit, 0) == ev.EDIT
    assert READER.read("!r", message(body=["hi"]), 0) == ev.MALFORMED
    assert READER.read("!r", message(sender="@" + "a" * 255), 0) == ev.MALFORMED
    assert READER.read("!r", {**message(), "content": "hi"}, 0) == ev.MALFORMED
    bad_root = message(content={"m.relates_to": {"rel_type": "m.thread", "event_id": 7}})
    assert READER.read("!r", bad_root, 0) == ev.MALFORMED


def test_the_size_cap_counts_bytes_and_lone_surrogates_do_not_raise() -> None:
    assert isinstance(READER.read("!r", message("é" * 32), 0), InboundEvent)  # 64 bytes
    assert READER.read("!r", message("é" * 32 + "x"), 0) == ev.OVERSIZED
    lone = READER.read("!r", message("\ud800"), 0)
    assert isinstance(lone, InboundEvent)
    assert lone.text == "\ud800"  # the inbox's checks judge it


def test_ids_with_a_lone_surrogate_are_malformed() -> None:
    """The state DB cannot store a lone surrogate: a thread, sender or event id holding one
    made the channel's sync retry that batch for ever (stop 47's review)."""
    thread = {"m.relates_to": {"rel_type": "m.thread", "event_id": "$\ud800"}}
    assert READER.read("!r", message(content=thread), 0) == ev.MALFORMED
    assert READER.read("!r", message(sender="@\udfff:x"), 0) == ev.MALFORMED
    assert READER.read("!r", {**message(), "event_id": "$\ud800"}, 0) == ev.MALFORMED


def test_threads_and_mentions() -> None:
    threaded = READER.read(
        "!r", message(content={"m.relates_to": {"rel_type": "m.thread", "event_id": "$root"}}), 0
    )
    assert isinstance(threaded, InboundEvent)
    assert (threaded.thread, threaded.mentioned) == ("$root", False)
    for mentioning in (
        message(content={"m.mentions": {"user_ids": [BOT]}}),
        message(f"ask {BOT}"),
        message("hey claw bot"),
    ):
        got = READER.read("!r", mentioning, 0)
        assert isinstance(got, InboundEvent)
        assert got.mentioned, mentioning
    not_a_list = READER.read("!r", message(content={"m.mentions": {"user_ids": BOT}}), 0)
    assert isinstance(not_a_list, InboundEvent)
    assert not not_a_list.mentioned


def test_the_bots_own_join_is_found() -> None:
    join = {"type": "m.room.member", "state_key": BOT, "content": {"membership": "join"}}
    other = {**join, "state_key": "@alice:x"}
    assert ev.joined_by([message(), other, join, message()], BOT) == 2
    assert ev.joined_by([message(), other], BOT) is None
    # The bot's new display name: a member event saying "join" after a join (stop 47's review:
    # the messages before it in that batch were dropped as if the room had just been joined).
    renamed = {**join, "unsigned": {"prev_content": {"membership": "join"}}}
    assert ev.joined_by([message(), renamed, message()], BOT) is None
    invited = {**join, "unsigned": {"prev_content": {"membership": "invite"}}}
    assert ev.joined_by([message(), invited, message()], BOT) == 1


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)  # fmt: skip


@given(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["m.room.message", "m.room.member"]) | JSON},
        optional={"event_id": JSON, "sender": JSON, "content": JSON, "state_key": JSON},
    )
)
def test_any_json_is_read_or_named_never_raised(source: dict[str, Any]) -> None:
    got = READER.read("!r", source, 0)
    assert isinstance(got, InboundEvent) or got in {ev.OWN, ev.OTHER, ev.EDIT, ev.MALFORMED,
                                                     ev.OVERSIZED}  # fmt: skip
    ev.joined_by([source], BOT)


def test_the_meter_allows_a_burst_per_key_and_refills() -> None:
    now = [0.0]
    meter = ev.Meter(2, lambda: now[0])
    assert [meter.take("a"), meter.take("a"), meter.take("a")] == [True, True, False]
    assert meter.take("b")  # another sender has its own bucket
    now[0] = 30.0  # half a minute: one token back
    assert [meter.take("a"), meter.take("a")] == [True, False]


def test_the_meter_stays_bounded_and_fast_whatever_the_senders() -> None:
    now = [0.0]
    meter = ev.Meter(60, lambda: now[0])
    for i in range(20_000):  # all busy at once: the oldest are forgotten
        meter.take(f"@s{i}:x")
    assert len(meter._buckets) <= ev.Meter.MAX_KEYS
    assert meter.take("@s19999:x")  # a recent sender keeps its bucket (59 tokens left)
    now[0] = 120.0  # every bucket full again: all are forgotten at the next new sender
    for i in range(ev.Meter.MAX_KEYS):
        meter.take(f"@t{i}:x")
    meter.take("@late:x")
    assert len(meter._buckets) <= ev.Meter.MAX_KEYS // 2 + 1
