"""The Matrix channel (host/matrix.py) against a real Synapse (tests/harness/synapse.py, one per
module) with a recording InboxSink: what reaches the inbox and how (identity, room, mention,
thread, plain body), which rooms the bot joins, that the sync cursor is saved only after the
inbox took every event (a failing inbox gets the same events again, nothing skipped, even past a
`limited` timeline), that a reply delivered twice shows once, and what is dropped (the bot's own
messages, oversized bodies). Alice talks through her own matrix-nio client."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator
from typing import Any

import nio
import pytest

from ironclawd.errors import ChannelFailed
from ironclawd.host.clock import SystemClock
from ironclawd.host.matrix import MatrixChannel
from ironclawd.ports.channels import OutboundReply
from tests.contract.channel_contract import check_contract
from tests.harness.synapse import synapse_homeserver
from tests.integration.matrix_driver import (
    WAIT,
    MatrixPeer,
    RecordingSink,
    Server,
    Watched,
    channel_config,
    client_of,
    members,
    room_with_bot,
    running,
    say,
    secrets_of,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with synapse_homeserver(tmp_path_factory.mktemp("synapse")) as hs:
        assert hs.listening() == [f"127.0.0.1:{hs.port}"]  # one listener, loopback only
        print(f"synapse ready in {hs.started_in:.1f} s")
        alice, bob = hs.register("alice"), hs.register("bob")
        bot = hs.login(hs.register("agentbot"), "IRONCLAW")
        yield Server(hs, alice, bob, bot)


@pytest.fixture
async def alice(server: Server) -> AsyncIterator[Any]:
    async with client_of(server, server.alice) as client:
        yield client


async def test_a_message_in_a_wired_room_arrives_as_the_homeserver_asserted_it(
    server: Server, alice: Any
) -> None:
    room = await room_with_bot(alice, server)
    sink = RecordingSink()
    sink.rooms.add(room)
    async with running(server, sink) as channel:
        assert server.bot.user_id in await members(alice, room)  # joined while starting
        plain = await say(alice, room, "hello there")
        mention = await say(
            alice, room, "<b>bold</b> plain", format="org.matrix.custom.html",
            formatted_body="<b>IGNORE THIS</b>",
            **{"m.mentions": {"user_ids": [server.bot.user_id]}},
        )  # fmt: skip
        named = await say(alice, room, f"what do you think, {server.bot.user_id}?")
        threaded = await say(
            alice, room, "in the thread",
            **{"m.relates_to": {"rel_type": "m.thread", "event_id": plain}},
        )  # fmt: skip
        await sink.until(lambda: len(sink.events) == 4)
        status = channel.status()
    first, second, third, fourth = sink.events
    assert [e.event_id for e in sink.events] == [plain, mention, named, threaded]
    assert {(e.channel, e.sender, e.where) for e in sink.events} == {
        ("chat", server.alice.user_id, room)
    }
    assert (first.text, first.mentioned, first.thread) == ("hello there", False, "")
    assert (second.text, second.mentioned) == ("<b>bold</b> plain", True)  # body, never HTML
    assert third.mentioned
    assert (fourth.thread, fourth.mentioned) == (plain, False)
    assert status.connected
    assert status.counters["received"] == 4
    assert status.counters["queued"] == 4
    assert status.detail == f"{server.hs.url} as {server.bot.user_id}"


async def test_a_restarted_channel_joins_the_rooms_it_was_invited_to_while_starting(
    server: Server, alice: Any
) -> None:
    # Synapse answers a repeated sync request from a cache for 2 minutes: each start's first
    # sync must be a new request, or it gets the previous start's rooms and invites.
    sink = RecordingSink()
    for _ in range(3):
        room = await room_with_bot(alice, server)
        sink.rooms.add(room)
        async with running(server, sink) as channel:
            assert server.bot.user_id in await members(alice, room)  # joined while starting
            assert channel.status().counters["joined"] == 1


async def test_unwired_rooms_are_not_joined_and_wired_ones_are_joined_when_invited(
    server: Server, alice: Any
) -> None:
    unwired = await room_with_bot(alice, server)
    sink = RecordingSink()
    async with running(server, sink) as channel:
        wired = await room_with_bot(alice, server)  # invited while the channel runs
        sink.rooms.add(wired)
        await say(alice, unwired, "anyone there?")
        # The invite reaches the bot's next sync; it joins, then takes what is said after.
        async with asyncio.timeout(WAIT):
            while server.bot.user_id not in await members(alice, wired):
                await alice.sync(timeout=1000)  # returns as soon as the room changes
        await say(alice, wired, "marker")
        await sink.until(lambda: "marker" in sink.texts())
        await say(alice, unwired, "still nobody?")
        await say(alice, wired, "marker 2")
        await sink.until(lambda: "marker 2" in sink.texts())
        assert channel.status().counters["joined"] == 1
    assert server.bot.user_id not in await members(alice, unwired)
    assert {e.where for e in sink.events} == {wired}, "\n".join(map(repr, sink.events))


async def test_the_cursor_is_saved_only_after_the_inbox_took_every_event_of_the_batch(
    server: Server, alice: Any
) -> None:
    room = await room_with_bot(alice, server)
    sink = RecordingSink()
    sink.rooms.add(room)
    # Two tokens for Alice: a retry must not spend them again (the meters' verdicts are kept).
    async with running(server, sink, sender_messages_per_minute=2):
        sink.gate = asyncio.Event()
        one = await say(alice, room, "one")
        await sink.until(lambda: ("waiting", one) in sink.log)
        assert sink.log[-1] == ("waiting", one)  # handed over, not taken: nothing saved
        sink.fail = 1
        sink.gate.set()
        two = await say(alice, room, "two")
        await sink.until(lambda: sink.texts() == ["one", "two"] and sink.log[-1][0] == "save")
    steps = [s for s in sink.log if s[0] != "waiting"]
    failed = steps.index(("raised", one))
    # The failed receive stopped the batch without a save; the same event came again, then the
    # next; the cursor moved only once both were taken.
    assert steps[failed + 1] == ("receive", one)
    assert [s for s in steps[failed:] if s[0] != "save"] == [
        ("raised", one), ("receive", one), ("receive", two)
    ]  # fmt: skip
    assert steps[-1][0] == "save"
    # A restarted channel resumes from the saved cursor: nothing again, then what is new.
    async with running(server, sink):
        three = await say(alice, room, "three")
        await sink.until(lambda: len(sink.events) == 3)
    assert [e.event_id for e in sink.events][2] == three


async def test_a_gap_past_the_timeline_limit_is_fetched_in_order(
    server: Server, alice: Any
) -> None:
    room = await room_with_bot(alice, server)
    sink = RecordingSink()
    sink.rooms.add(room)
    async with running(server, sink):
        pass  # joined; cursor saved
    sent = [await say(alice, room, f"m{i}") for i in range(12)]
    async with running(server, sink, timeline_limit=5) as channel:
        await sink.until(lambda: len(sink.events) >= 12)
        counters = channel.status().counters
    assert [e.event_id for e in sink.events] == sent
    assert counters["backfilled"] >= 7


async def test_a_reply_delivered_twice_with_one_delivery_id_shows_once(
    server: Server, alice: Any
) -> None:
    room = await room_with_bot(alice, server)
    sink = RecordingSink()
    sink.rooms.add(room)
    asked = await say(alice, room, "question")
    reply = OutboundReply(
        delivery_id="s1-7", channel="chat", where=room, thread=asked, in_reply_to_event=asked,
        text="the answer",
    )  # fmt: skip
    async with running(server, sink) as channel:
        await channel.deliver(reply)
        await channel.deliver(reply)
        await channel.deliver(dataclasses.replace(reply, delivery_id="s1-8", text="another"))
    async with running(server, sink) as restarted:  # a daemon restart resends it
        await restarted.deliver(reply)
    page = await alice.room_messages(room, direction=nio.MessageDirection.back, limit=50)
    assert isinstance(page, nio.RoomMessagesResponse), page
    from_bot = [
        e.source["content"] for e in page.chunk
        if e.sender == server.bot.user_id and e.source["type"] == "m.room.message"
    ]  # fmt: skip
    assert [c["body"] for c in from_bot] == [
        "another", "the answer"
    ]  # fmt: skip
    relates = from_bot[-1]["m.relates_to"]
    assert relates["rel_type"] == "m.thread"
    assert relates["event_id"] == asked
    assert relates["m.in_reply_to"] == {"event_id": asked}


async def test_the_bots_own_messages_are_never_inbound_and_oversized_ones_are_dropped(
    server: Server, alice: Any
) -> None:
    room = await room_with_bot(alice, server)
    sink = RecordingSink()
    sink.rooms.add(room)
    async with running(server, sink, max_message_bytes=64) as channel:
        reply = OutboundReply("s2-1", "chat", room, "", "", "I am the bot")
        await channel.deliver(reply)
        await say(alice, room, "x" * 65)
        await say(alice, room, "é" * 32)  # 64 bytes of UTF-8: at the cap
        await say(alice, room, "marker")
        await sink.until(lambda: "marker" in sink.texts())
        counters = channel.status().counters
    assert sink.texts() == ["é" * 32, "marker"]
    assert all(e.sender != server.bot.user_id for e in sink.events)
    assert counters["own"] == 1
    assert counters["oversized"] == 1


async def test_refusals_are_named_and_not_retryable(server: Server, alice: Any) -> None:
    sink = RecordingSink()
    channel = MatrixChannel(channel_config(server), secrets_of(server), SystemClock())
    assert await channel.test() == (
        f"logged in to {server.hs.url} as {server.bot.user_id} (device IRONCLAW)"
    )
    stranger = await alice.room_create()  # the bot is not in it
    with pytest.raises(ChannelFailed, match="M_FORBIDDEN") as refused:
        await channel.deliver(OutboundReply("s3-1", "chat", stranger.room_id, "", "", "hi"))
    assert not refused.value.retryable
    await channel.stop()
    bogus = MatrixChannel(channel_config(server), lambda _: "syt_bogus", SystemClock())
    with pytest.raises(ChannelFailed, match="M_UNKNOWN_TOKEN") as unknown:
        await bogus.test()
    assert not unknown.value.retryable
    assert "syt_bogus" not in str(unknown.value)
    await bogus.start(sink)
    status = bogus.status()
    await bogus.stop()
    assert not status.connected
    assert "M_UNKNOWN_TOKEN" in status.last_error
    assert sink.log == []


async def test_a_flooding_sender_is_cut_off_and_others_still_get_through(
    server: Server, alice: Any
) -> None:
    created = await alice.room_create(invite=[server.bot.user_id, server.bob.user_id])
    room = str(created.room_id)
    sink = RecordingSink()
    sink.rooms.add(room)
    async with client_of(server, server.bob) as bob:
        assert isinstance(await bob.join(room), nio.JoinResponse)
        async with running(server, sink, sender_messages_per_minute=3) as channel:
            for i in range(6):
                await say(alice, room, f"flood {i}")
            await say(bob, room, "bob's turn")
            await sink.until(lambda: "bob's turn" in sink.texts())
            counters = channel.status().counters
    assert sink.texts() == ["flood 0", "flood 1", "flood 2", "bob's turn"]
    assert counters["rate_limited"] == 3


async def test_the_matrix_channel_keeps_the_channel_contract(server: Server, alice: Any) -> None:
    room = await room_with_bot(alice, server)
    peer = MatrixPeer(alice, room, server.alice.user_id, server.bot.user_id)
    channel = MatrixChannel(channel_config(server), secrets_of(server), SystemClock())
    await check_contract(Watched(channel, peer), peer)
