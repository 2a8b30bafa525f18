"""A session held at a reply bound whose agent's outbound queue then fills, against the real
thing (stop 52: agent/loop.py, agent/queues.py, services/messaging.py): ironclawd under a private
systemd, a real runsc sandbox running the frozen agent, the host's mock model, and the session's
outbound tmpfs at its smallest.

What is shown: past ``[queues] max_rows`` the session's replies are held (its error says so and
what to do) and wait in its outbound queue, which then fills; the agent keeps the reply the full
queue refuses, lets the messages after it wait, asks the model nothing twice and is never
restarted; once the bound is raised (``systemctl reload``) every message has exactly one reply,
in order, with its text, and the model was asked each message exactly once.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.agents import unlimited_agent
from tests.harness.boxes import CONFIG, open_boxes, out, restarted_with
from tests.harness.polling import wait_for
from tests.harness.private_systemd import SystemdHarness
from tests.integration.test_model_proxy import ctl, cursor, journal_json, model_records

pytestmark = pytest.mark.integration

AGENT = "fullq"
DAEMON_UNIT = "ironclawd.service"
HELD_AT = 3  # [queues] max_rows while held: reply 4 and every one after it wait in the queue
RAISED = 1000
# The outbound tmpfs at the smallest the config allows (1 MiB). The agent lets outbound.db grow
# to its file system's size less a quarter (agent/queues.py HEADROOM), 768 KiB: about a dozen
# replies of 60 KB (some 15 pages of 4 KiB each), so the reply to message 15-17 is refused. If
# statvfs inside runsc did not give the tmpfs's size, the tmpfs's own ENOSPC would refuse one
# near message 20 instead. COUNT leaves several messages waiting behind it either way.
OUTBOUND_BYTES = 1024 * 1024
PADDING = 60_000  # a message's text (at most 64 KiB): the mock model's reply echoes it
COUNT = 28
WAITING = 4  # at least this many messages come after the reply kept in hand
# How long the held, full session is watched for model calls it should not make: long enough
# for the agent's own tries again (1 s, then 3 s after a refusal).
HOLD_SECONDS = 4.0
SETTLE_WITHIN = 60.0  # a net for an agent that never stops answering, not a timing
KEEPING = re.compile(r"agent: keeping the reply to message (\d+) until outbound\.db has room")


def config(max_rows: int) -> str:
    return unlimited_agent(AGENT) + (
        "\n[daemon]\n"
        # Every "still held" line written, none counted away: the agent's asks are counted.
        "agent_log_lines = 100000\n"
        "\n[queues]\n"
        f"outbound_bytes = {OUTBOUND_BYTES}\n"
        f"max_rows = {max_rows}\n"
    )


@pytest.fixture(scope="module")
def held_config(daemon: SystemdHarness) -> Iterator[None]:
    """The daemon restarted with the bound low; the default config again afterwards."""
    with restarted_with(daemon, config(HELD_AT)):
        yield


def messages(sysd: SystemdHarness, mark: str, unit: str) -> list[str]:
    """The journal lines of ``unit`` after ``mark`` (filtered here: journal_json says why)."""
    found = []
    for entry in journal_json(sysd, mark, _SYSTEMD_UNIT=unit):
        text = entry.get("MESSAGE", "")
        found.append(text if isinstance(text, str) else bytes(text).decode(errors="replace"))
    return found


def sandbox_run(sysd: SystemdHarness, unit: str) -> dict[str, str]:
    """Which run of the sandbox unit this is: a sandbox started again under the same name (its
    agent died, and the session was resumed) has another InvocationID and MainPID."""
    proc = sysd.run(["systemctl", "show", "--property=InvocationID,MainPID", unit])
    assert proc.returncode == 0, out(proc)
    shown = dict(line.split("=", 1) for line in out(proc).splitlines() if "=" in line)
    assert shown.get("InvocationID"), shown
    assert shown.get("MainPID", "0") != "0", shown
    return shown


def progress(sysd: SystemdHarness, mark: str, unit: str, sid: str) -> tuple[int, int]:
    """The message whose reply the agent last said it keeps in hand (0: none yet), and how many
    model calls the session made."""
    kept = [m for m in map(KEEPING.search, messages(sysd, mark, unit)) if m is not None]
    made = journal_json(sysd, mark, LOGGER="ironclawd.model", IRONCLAW_SID=sid)
    return (int(kept[-1].group(1)) if kept else 0), len(made)


def calls(sysd: SystemdHarness, mark: str, sid: str, count: int) -> list[dict[str, Any]]:
    """The session's model call records once ``count`` are in, and a second later: journald
    takes them in asynchronously, and a record more would come in that second."""
    model_records(sysd, mark, sid, count)
    time.sleep(1.0)
    return journal_json(sysd, mark, LOGGER="ironclawd.model", IRONCLAW_SID=sid)


def test_a_held_session_whose_queue_fills_loses_no_reply_and_asks_the_model_once_each(
    daemon: SystemdHarness, held_config: None
) -> None:
    texts = [f"message {n:02d} {'x' * PADDING}" for n in range(1, COUNT + 1)]
    expected = [f"mock: {text}" for text in texts]
    mark = cursor(daemon)
    with open_boxes(daemon, AGENT) as boxes:
        box = boxes.create()
        sid = box.sid
        started = sandbox_run(daemon, box.unit)
        for n, text in enumerate(texts, 1):
            assert box.send(text).seq == n

        # 1. Held at the bound, then full. The agent says which reply it keeps in hand, once
        # per episode, and there may be more than one: the rows taken before the bound may be
        # pruned only after the queue first filled (the agent answers the messages it was told
        # of before it prunes), and make room for a few more. Settled once a whole window
        # passes with nothing new: no reply kept in hand anew, no model call.
        in_hand, asked = wait_for(
            "the agent keeping a reply its full outbound queue refuses",
            lambda: progress(daemon, mark, box.unit, sid),
            lambda now: now[0] > 0,
            90,
        )
        settle_by = time.monotonic() + SETTLE_WITHIN
        while True:
            window = cursor(daemon)
            time.sleep(HOLD_SECONDS)
            now = progress(daemon, mark, box.unit, sid)
            if now == (in_hand, asked):
                break
            assert time.monotonic() < settle_by, f"still answering after {SETTLE_WITHIN:g} s: {now}"
            in_hand, asked = now
        assert HELD_AT < in_hand <= COUNT - WAITING, (
            f"the queue filled at message {in_hand}: this test needs it to fill after the bound "
            f"({HELD_AT}) and with {WAITING} messages or more still to answer ({COUNT} sent)"
        )
        shown = ctl(daemon, "session", "show", sid)[1]
        assert shown["state"] == "running", shown
        assert f"replies held in its outbound queue from seq {HELD_AT + 1}" in shown["error"]
        assert f"[queues] max_rows ({HELD_AT})" in shown["error"], shown
        assert "systemctl reload ironclawd" in shown["error"], shown

        # 2. While held and full, over that window: the model was asked messages 1..in_hand
        # (the last one's reply is the one in hand) and no other, though the agent tried to
        # store that reply again meanwhile; no reply past the bound is shown.
        assert asked == in_hand, f"{asked} model calls, the reply to message {in_hand} in hand"
        records = journal_json(daemon, mark, LOGGER="ironclawd.model", IRONCLAW_SID=sid)
        assert {r.get("IRONCLAW_STATUS") for r in records} == {"ok"}, records
        assert [r.text for r in box.replies()] == expected[:HELD_AT]
        # Each ask of the agent (its queue full, it announces its newest seq again) is read as
        # a held session's announcement: one "still held" line each (none counted away here).
        held_line = f"session {sid}: replies still held in its outbound queue"
        asks = sum(held_line in line for line in messages(daemon, window, DAEMON_UNIT))
        # Backing off from 1 s, doubling, the agent asks at most 3 times in the window; the
        # host's repeated "ingested" line (it took nothing new) makes no room and must not make
        # it ask at once (it did: at the control line rate).
        print(f"held and full: the agent asked the host {asks} times in {HOLD_SECONDS:g} s")
        assert asks <= 4, asks

        # 3. The bound raised and reloaded: every message answered once, in order.
        daemon.run(["tee", CONFIG], input=config(RAISED).encode(), check=True)
        proc = daemon.run(["systemctl", "reload", DAEMON_UNIT], timeout=60)
        assert proc.returncode == 0, out(proc)
        replies = box.wait_replies(COUNT, timeout=120)  # a net for a wedged run, not a timing
        assert [(r.seq, r.in_reply_to) for r in replies] == [(n, n) for n in range(1, COUNT + 1)]
        assert [r.text for r in replies] == expected
        assert len(box.replies()) == COUNT
        # COUNT messages and COUNT model calls: none was asked twice (each was asked at least
        # once, as each has its answer).
        records = calls(daemon, mark, sid, COUNT)
        assert len(records) == COUNT, records
        assert {r.get("IRONCLAW_STATUS") for r in records} == {"ok"}, records
        shown = ctl(daemon, "session", "show", sid)[1]
        assert (shown["state"], shown.get("error", "")) == ("running", ""), shown

        # 4. The agent was never restarted. The agent is the sandbox's only process of its own
        # (the container's init): had it died, runsc would have exited with it, the daemon
        # would have failed the session ("sandbox exited") and resumed it in a new run of the
        # same unit ("sandbox gone with messages unanswered"), which says hello anew.
        assert sandbox_run(daemon, box.unit) == started
        daemon_lines = messages(daemon, mark, DAEMON_UNIT)
        assert sum(f"session {sid} running: agent pid" in line for line in daemon_lines) == 1
        for gone in ("sandbox exited", "sandbox gone", "closed its control connection"):
            assert not [line for line in daemon_lines if sid in line and gone in line], gone
        assert f"session {sid}: replies are taken again from seq {HELD_AT + 1}" in daemon_lines
        assert not [line for line in messages(daemon, mark, box.unit) if "Traceback" in line]
