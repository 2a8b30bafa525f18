"""The agent's main loop: answer every inbound message once, in order, and announce each reply.

Events come from the control socket: "inbound <seq>"; "ingested <seq>" when the host holds
every reply up to seq (they are pruned from outbound.db); and "restarted 0" when a new daemon
took the connection back after a restart (the responder's channels are dropped, and the
inbound queue is read: a message sent before the new daemon took the connection back was
announced to no one). Nothing polls.
After ``IDLE_SECONDS`` without a message, the responder rests (closes its gRPC channels, whose
threads would otherwise keep waking an idle sandbox) until the next message. A restart resumes
after the newest inbound seq already answered (recorded in outbound.db in the same transaction
as the reply), so no message is answered twice or skipped.
A reply that cannot be stored (outbound.db full: the host holds the session's replies at a
bound, say) is kept in hand, and nothing after it is answered meanwhile: it is stored again at
once after each prune, else after a back-off (STORE_RETRY_FIRST doubling to STORE_RETRY_MAX).
Each failed try announces the newest stored seq again: an announcement of nothing new asks the
host what may be pruned (ironclawd/services/messaging.py ``_offer_pruning``).
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

import sqlcipher3

from agent.model import ModelResponder
from agent.queues import Inbound, Outbound, read_key

KEY_FILE = Path("/run/ironclaw-key")
INBOUND_DB = Path("/queue/inbound/inbound.db")
OUTBOUND_DB = Path("/queue/outbound/outbound.db")
MODEL_SOCKET = Path("/run/ironclaw/model.sock")
# Quiet this long after a reply, the responder closes its channels. Back-to-back messages keep
# them; a conversation that pauses pays one reconnect (~20 ms in gVisor) for the next turn.
IDLE_SECONDS = 15.0
# The host's first line on a control connection it restored after a restart
# (ironclawd/api/control.py RESTARTED_LINE).
RESTARTED = b"restarted"
# "ingested <seq>": the host holds every reply up to seq; the agent may drop them from its file
# (ironclawd/services/messaging.py, every ``[queues] prune_after_rows`` replies).
INGESTED = b"ingested"
# The version of the protocol this agent speaks with its daemon: the control lines, the gRPC
# services it calls and its queue format (ironclawd/domain/agent_protocol.py PROTOCOL_VERSION,
# which a test pins to this). A daemon of another ironclawd version that adopts this sandbox
# refuses an agent of a version it does not speak. Named in the hello from version 2 on: a
# version-1 hello is the one agents said before versions were announced, which every daemon reads.
PROTOCOL_VERSION = 1
# A reply kept in hand is stored again after this long, doubled after each failure up to the
# most (the host's "ingested" line, which makes room, is acted on at once).
STORE_RETRY_FIRST = 1.0
STORE_RETRY_MAX = 60.0

Responder = Callable[[str], str]


def echo(text: str) -> str:
    """The deterministic stand-in for a model, for a session without a model socket."""
    return f"echo: {text}"


def default_responder() -> Responder:
    """The model through the host's proxy when its socket is there, else the echo."""
    if MODEL_SOCKET.exists():
        return ModelResponder(str(MODEL_SOCKET))
    return echo


class Agent:
    def __init__(self, respond: Responder | None = None) -> None:
        key = read_key(KEY_FILE)
        self.inbound = Inbound(INBOUND_DB, key)
        self.outbound = Outbound(OUTBOUND_DB, key)
        self.answered = self.outbound.last_answered()
        self._respond = respond or default_responder()
        self._awake = False
        self._pruned = 0
        self._unsaved: tuple[int, str] | None = None  # (inbound seq, reply) not stored yet
        self._retry = 0.0  # the back-off before storing it again; 0: no reply in hand
        self._retry_at = 0.0  # time.monotonic() of the next try

    def hello(self) -> bytes:
        return hello_line(os.getpid(), os.getuid(), self.outbound.last_seq())

    def catch_up(self, sock: socket.socket, up_to: int | None) -> None:
        """Answer every message after the last answered one (up to ``up_to`` if given), once
        the reply in hand, if there is one, is stored; stop at a reply that cannot be."""
        if not self._store(sock):
            return
        for seq, body in self.inbound.read_after(self.answered, up_to):
            self._unsaved = (seq, self._respond(body))
            self.answered = seq  # the model is not asked again for what it answered
            if not self._store(sock):
                return

    def _store(self, sock: socket.socket) -> bool:
        """Store and announce the reply in hand; False if it stays in hand (the queue is full:
        the host is asked what may be pruned, and the next try is set for after the back-off)."""
        if self._unsaved is None:
            return True
        seq, reply = self._unsaved
        try:
            out = self.outbound.append(seq, reply)
        except sqlcipher3.OperationalError as exc:  # "database or disk is full"
            if not self._retry:
                print(f"agent: keeping the reply to message {seq} until outbound.db has room: "
                      f"{exc}", file=sys.stderr, flush=True)  # fmt: skip
            self.rest(sock)  # nothing is asked of the model until it is stored
            self._retry = min(max(self._retry * 2, STORE_RETRY_FIRST), STORE_RETRY_MAX)
            self._retry_at = time.monotonic() + self._retry  # host lines may keep coming
            _receive_timeout(sock, self._retry)
            sock.sendall(f"outbound {self.outbound.last_seq()}\n".encode("ascii"))
            return False
        self._unsaved, self._retry = None, 0.0
        sock.sendall(f"outbound {out}\n".encode("ascii"))
        if not self._awake:  # the responder rests after IDLE_SECONDS without a message
            _receive_timeout(sock, IDLE_SECONDS)
            self._awake = True
        return True

    def rest(self, sock: socket.socket) -> None:
        """Nothing came for IDLE_SECONDS: let the responder close what it keeps open, and wait
        for the next message without a timeout (an idle agent makes no call at all)."""
        rest = getattr(self._respond, "rest", None)
        if rest is not None:
            rest()
        _receive_timeout(sock, 0.0)
        self._awake = False

    def prepare(self, sock: socket.socket) -> None:
        """A session has just claimed this pooled sandbox: let the responder get ready for the
        first message, which is on its way, and rest again after IDLE_SECONDS if none comes."""
        prepare = getattr(self._respond, "prepare", None)
        if prepare is None:
            return
        prepare()
        _receive_timeout(sock, IDLE_SECONDS)
        self._awake = True

    def serve(self, sock: socket.socket, *, claimed: bool = False) -> None:
        """Run until the host closes the connection. ``claimed``: this is the first connection
        of a pooled sandbox a session has just claimed (``prepare``)."""
        # A new connection follows a host that went away: the connections under the responder's
        # channels ended with it, and gRPC's client would find that out only by failing a call.
        self.rest(sock)
        sock.sendall(self.hello())
        if claimed:
            self.prepare(sock)
        self.catch_up(sock, None)
        pending = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except BlockingIOError:  # SO_RCVTIMEO ran out: IDLE_SECONDS without a message
                if self._unsaved is not None:  # or the back-off of the reply in hand
                    self.catch_up(sock, None)
                else:
                    self.rest(sock)
                continue
            if not chunk:
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            self._act(sock, lines)

    def _act(self, sock: socket.socket, lines: list[bytes]) -> None:
        """What the host's ``lines`` ask for, each kind at most once."""
        announced = ingested = 0
        restarted = False
        for line in lines:
            words = line.split()
            if len(words) != 2 or not words[1].isdigit():
                continue
            if words[0] == b"inbound":
                announced = max(announced, int(words[1]))
            elif words[0] == INGESTED:
                ingested = max(ingested, int(words[1]))
            elif words[0] == RESTARTED:
                # A new daemon took this connection back from systemd's fd store; the
                # connections under the responder's channels (model, tools) ended.
                self.rest(sock)
                restarted = True
        held = self._unsaved is not None
        if held:
            # Room for the reply in hand first. Only a prune makes room: a held session's host
            # answers each ask with the offer it made before, which must not hold off the
            # back-off (a try at every such line was thousands of asks a second).
            room = ingested > self._pruned and self.prune(ingested)
            if not (room or restarted or time.monotonic() >= self._retry_at):
                return  # nothing made room: the reply in hand is tried again at its time
        if restarted or held:
            # A message sent to the new daemon before it took this connection back was queued
            # with no one to tell ("waits in its queue"): read the queue now.
            self.catch_up(sock, None)
        if announced > self.answered and self._unsaved is None:
            self.catch_up(sock, announced)
        if ingested > self._pruned:  # after answering: the messages come first
            self.prune(ingested)

    def prune(self, up_to: int) -> bool:
        """Drop the replies the host holds; False if that failed. A failure costs nothing but
        space: the rows stay, and the host's next "ingested" line tries again (a reply kept in
        hand asks for one)."""
        try:
            self.outbound.prune(up_to)
        except sqlcipher3.Error as exc:
            print(f"agent: pruning outbound.db up to {up_to}: {exc}", file=sys.stderr, flush=True)
            return False
        self._pruned = up_to
        return True


def hello_line(pid: int, uid: int, seq: int, protocol: int = PROTOCOL_VERSION) -> bytes:
    """``hello <pid> <uid> <outbound seq> [v<protocol>]``, the version left out for 1."""
    version = f" v{protocol}" if protocol != 1 else ""
    return f"hello {pid} {uid} {seq}{version}\n".encode("ascii")


def _receive_timeout(sock: socket.socket, seconds: float) -> None:
    """A blocking ``recv`` on ``sock`` fails with EAGAIN after ``seconds`` (0: never). The kernel's
    SO_RCVTIMEO, not a Python socket timeout: that one makes the socket non-blocking and calls
    poll(2) before every send and receive, and each call is a trip through gVisor's sentry."""
    whole = int(seconds)
    sock.setsockopt(
        socket.SOL_SOCKET,
        socket.SO_RCVTIMEO,
        struct.pack("@ll", whole, int((seconds - whole) * 1_000_000)),
    )
