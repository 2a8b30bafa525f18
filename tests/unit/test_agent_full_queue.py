"""An agent whose outbound.db is full (agent/loop.py): the host holds the session's replies at a
bound, or has not yet offered to prune them. The append raised "database or disk is full",
which nothing caught: the agent died, was started again (up to 5 times a minute) and asked the
model the same message each time. Now the reply is kept in hand: the agent asks the host what it
may prune (it announces its newest seq again), backs off, and stores the reply as soon as a
prune makes room; nothing is lost and the model is asked once per message.

The loop runs against real queue files and a socket pair standing for the control socket
(as in test_agent_rest.py); the queue is full for real, at the size the agent leaves itself on
a tmpfs ``os.statvfs`` says is 1 MiB (test_agent_queue_room.py)."""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlcipher3

from agent import loop, queues
from ironclawd.store.queues import INBOUND_SCHEMA
from tests.unit.test_agent_queue_room import MIB, small_tmpfs

PADDING = "." * 60_000  # about a dozen replies fill what a 1 MiB tmpfs leaves the file


class Responder:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, text: str) -> str:
        self.asked.append(text)
        return f"re: {text} {PADDING}"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[sqlcipher3.Connection]:
    """The session's inbound.db as the host writes it; the agent's files in ``tmp_path``."""
    key = secrets.token_bytes(32)
    (tmp_path / "key").write_text(key.hex())
    monkeypatch.setattr(loop, "KEY_FILE", tmp_path / "key")
    monkeypatch.setattr(loop, "INBOUND_DB", tmp_path / "inbound.db")
    monkeypatch.setattr(loop, "OUTBOUND_DB", tmp_path / "outbound.db")
    monkeypatch.setattr(loop, "IDLE_SECONDS", 60.0)
    monkeypatch.setattr(loop, "STORE_RETRY_FIRST", 30.0)  # no try but the ones a line causes
    small_tmpfs(monkeypatch, MIB)
    db = sqlcipher3.connect(str(tmp_path / "inbound.db"), isolation_level=None)
    db.execute(f"PRAGMA key = \"x'{key.hex()}'\"")
    db.execute("PRAGMA journal_mode = DELETE")
    db.execute(INBOUND_SCHEMA)
    yield db
    db.close()


def send(db: sqlcipher3.Connection, count: int) -> None:
    for n in range(count):
        db.execute("INSERT INTO messages (created_at, body) VALUES (1.0, ?)", (f"m{n + 1}",))


def line(sock: socket.socket) -> tuple[str, int]:
    got = b""
    while not got.endswith(b"\n"):
        chunk = sock.recv(1)  # the socket's timeout: a dead agent fails the test, not hangs it
        assert chunk, "the agent closed the control socket"
        got += chunk
    words = got.split()  # "hello <pid> <uid> <seq>", "outbound <seq>"
    return words[0].decode(), int(words[-1])


@contextlib.contextmanager
def serving(responder: Responder) -> Iterator[tuple[socket.socket, threading.Thread]]:
    """The agent's loop on a thread; the host's end of the socket pair after the hello (which
    names the newest seq stored)."""
    ours, theirs = socket.socketpair()
    ours.settimeout(5)
    failed: list[BaseException] = []

    def run() -> None:
        try:  # the host going away mid-line is the end run_control expects (agent/main.py)
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                loop.Agent(responder).serve(theirs)
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert line(ours)[0] == "hello"
        yield ours, thread
    finally:
        ours.close()
        thread.join(5)
        theirs.close()
    assert not failed, failed
    assert not thread.is_alive()


def until_full(ours: socket.socket) -> list[int]:
    """The seqs announced until the agent announces one again: its queue is full."""
    seqs: list[int] = []
    while True:
        word, seq = line(ours)
        assert word == "outbound"
        if seqs and seq == seqs[-1]:
            return seqs
        seqs.append(seq)


def test_a_reply_a_full_queue_refuses_is_kept_and_stored_once_the_host_prunes(
    host: sqlcipher3.Connection,
) -> None:
    responder = Responder()
    send(host, 40)
    with serving(responder) as (ours, thread):
        ours.sendall(b"inbound 40\n")
        announced = until_full(ours)
        full = len(announced)
        assert announced == list(range(1, full + 1))
        assert 5 < full < 30
        # It is waiting, not dead, and has asked the model for one reply more than it stored.
        time.sleep(0.2)
        assert thread.is_alive()
        assert responder.asked == [f"m{n}" for n in range(1, full + 2)]
        ours.sendall(f"ingested {full}\n".encode())  # what the host says once it took them
        rounds = 1
        while announced[-1] < 40:
            seq = line(ours)[1]
            if seq == announced[-1]:  # full again: it asks
                ours.sendall(f"ingested {seq}\n".encode())
                rounds += 1
                continue
            assert seq == announced[-1] + 1
            announced.append(seq)
        assert rounds >= 3
        assert announced == list(range(1, 41))
        assert responder.asked == [f"m{n}" for n in range(1, 41)]  # each asked once


def test_with_no_word_from_the_host_it_asks_again_backing_off(
    host: sqlcipher3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's "ingested" line may be lost (sent while the agent was not connected, or
    never sent: a held session takes nothing until a reload): the agent asks again, at a
    back-off, and never spins."""
    monkeypatch.setattr(loop, "STORE_RETRY_FIRST", 0.05)
    monkeypatch.setattr(loop, "STORE_RETRY_MAX", 0.2)
    responder = Responder()
    send(host, 30)
    with serving(responder) as (ours, _thread):
        ours.sendall(b"inbound 30\n")
        stored = until_full(ours)[-1]
        asked = len(responder.asked)
        started, again = time.monotonic(), 0
        while time.monotonic() - started < 1.0:
            assert line(ours) == ("outbound", stored)
            again += 1
        assert 3 <= again <= 8  # 0.05, 0.1, then every 0.2 s
        assert len(responder.asked) == asked  # the model is not asked again meanwhile
        ours.sendall(f"ingested {stored}\n".encode())
        assert line(ours) == ("outbound", stored + 1)


def test_a_restarted_agent_over_a_full_queue_waits_for_room(
    host: sqlcipher3.Connection,
) -> None:
    """A new agent process (the sandbox started again) whose queue is full answers the next
    message before it reads any line of the host's: it keeps that reply too, and asks."""
    filled = queues.Outbound(loop.OUTBOUND_DB, queues.read_key(loop.KEY_FILE))
    full = 1
    with contextlib.suppress(sqlcipher3.OperationalError):
        while True:
            filled.append(full, f"earlier {PADDING}")
            full += 1
    filled._db.close()
    send(host, full + 1)
    responder = Responder()
    with serving(responder) as (ours, _thread):
        assert line(ours) == ("outbound", full - 1)  # after its hello: the ask
        assert responder.asked == [f"m{full}"]
        ours.sendall(f"ingested {full - 1}\n".encode())
        assert [line(ours) for _ in range(2)] == [("outbound", full), ("outbound", full + 1)]
        assert responder.asked == [f"m{full}", f"m{full + 1}"]


def test_a_held_session_repeating_what_was_pruned_does_not_hold_off_the_back_off(
    host: sqlcipher3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A held session's host answers each ask with the "ingested" line it sent before (it took
    nothing new): that makes no room, so the agent keeps to its back-off instead of trying again
    at once (6,878 asks in 2 s before; found by the review that wrote test_full_queue.py)."""
    monkeypatch.setattr(loop, "STORE_RETRY_FIRST", 0.05)
    monkeypatch.setattr(loop, "STORE_RETRY_MAX", 0.2)
    responder = Responder()
    send(host, 40)
    with serving(responder) as (ours, _thread):
        ours.sendall(b"inbound 40\n")
        stored = until_full(ours)[-1]
        ours.sendall(f"ingested {stored}\n".encode())  # room: it stores on and fills again
        full = until_full(ours)[-1]
        assert full > stored
        started, asks = time.monotonic(), 0
        while time.monotonic() - started < 1.0:
            ours.sendall(f"ingested {stored}\n".encode())  # held: the same offer again
            assert line(ours) == ("outbound", full)
            asks += 1
        assert asks <= 8  # 0.05, 0.1, then every 0.2 s: not one per line
