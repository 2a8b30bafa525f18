"""What the channel proofs through the real daemon share (tests/integration/test_channels_*.py):
a webhook reply receiver in a network namespace the test makes, a signing webhook sender that
retries like a real one, and Matrix users' clients (matrix-nio) driven from synchronous tests
through an event loop in a thread of their own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shutil
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import nio
import pytest

from ironclawd.formats.webhook_sig import HEADER, sign
from tests.harness.fixtures import RESULTS, ROOT
from tests.harness.polling import wait_for
from tests.harness.private_systemd import SystemdHarness

T = TypeVar("T")
RECEIVER_PORT = 8080


def out(proc: Any) -> str:
    return (proc.stdout or b"").decode(errors="replace") + (proc.stderr or b"").decode(
        errors="replace"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ctl(sysd: SystemdHarness, *args: str) -> Any:
    """``ironctl ARGS --json`` inside the test's systemd: its JSON, or fail with the daemon's
    journal tail."""
    proc = sysd.run(["ironctl", *args, "--json"], timeout=120)
    if proc.returncode != 0:
        journal = sysd.run(["journalctl", "-u", "ironclawd", "-n", "40", "--no-pager", "-o", "cat"])
        raise AssertionError((args, out(proc), out(journal)))
    return json.loads(proc.stdout.decode())


def approve(sysd: SystemdHarness, kind: str, payload: dict[str, Any], agent: str = "demo") -> None:
    """Submit a change and approve it, as an operator would; it must apply."""
    change = ctl(sysd, "change", "submit", "--kind", kind, "--agent", agent, "--payload",
                 json.dumps(payload), "--reason", "channels test")  # fmt: skip
    done = ctl(sysd, "change", "approve", change["id"], "--yes")
    assert done["state"] == "applied", done


def put_back(sysd: SystemdHarness, kind: str, payload: dict[str, Any], agent: str = "demo") -> None:
    """The agent's default again (nothing to do when the test never changed it)."""
    proc = sysd.run(["ironctl", "change", "submit", "--kind", kind, "--agent", agent,
                     "--payload", json.dumps(payload), "--json"], timeout=120)  # fmt: skip
    if "would change nothing" not in out(proc):
        assert proc.returncode == 0, out(proc)
        ctl(sysd, "change", "approve", json.loads(proc.stdout.decode())["id"], "--yes")


def logged_lines(log: Path) -> list[str]:
    """The whole lines of the receiver's log (tests/integration/channel_receiver.py). The
    receiver may be writing the last one as this reads, and a line of a long body takes more
    than one write: what follows the last newline is not finished yet (a read mid-write once
    failed a CI run with a cut-off JSON line)."""
    text = log.read_text() if log.exists() else ""
    return text.split("\n")[:-1]


@dataclass
class Receiver:
    """Replies POSTed by the daemon, as the receiver in the test's netns logged them."""

    cidr: str  # what [egress] internal_cidrs must open
    url: str  # http://<address>:8080
    log: Path

    def seen(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in logged_lines(self.log) if '"path"' in line]

    def replies(self, path: str) -> list[dict[str, Any]]:
        """The bodies POSTed to ``path``, each with its delivery id."""
        return [json.loads(e["body"]) for e in self.seen() if e["path"] == path]


@contextlib.contextmanager
def receiver_netns(sysd: SystemdHarness) -> Iterator[Receiver]:
    """A stdlib HTTP receiver (channel_receiver.py) in a new netns joined to the host's by a
    veth pair, at an address of 198.18.0.0/15 (benchmarking, not the broker's always-refused
    ranges); everything is removed afterwards."""
    tag = secrets.token_hex(3)
    octet = int(tag[:2], 16) % 250 + 1
    inside, outside = f"198.19.{octet}.1", f"198.19.{octet}.2"
    ns, veth_host, veth_ns = f"ictest-cw-{tag}", f"iccw{tag}h", f"iccw{tag}n"
    unit = f"ictest-channel-world-{tag}.service"
    logs = RESULTS / f"channels-world-{tag}"
    logs.mkdir(parents=True)
    script = ROOT / "tests/integration/channel_receiver.py"
    setup = f"""
        set -e
        ip netns add {ns}
        ip link add {veth_host} type veth peer name {veth_ns} netns {ns}
        ip addr add {outside}/24 dev {veth_host}
        ip link set {veth_host} up
        ip -n {ns} addr add {inside}/24 dev {veth_ns}
        ip -n {ns} link set {veth_ns} up
        ip -n {ns} link set lo up
        systemd-run --quiet --unit={unit} -p NetworkNamespacePath=/run/netns/{ns} \
            {sys.executable} {script} --listen {inside}:{RECEIVER_PORT} --log {logs}/rx.jsonl
    """
    teardown = f"""
        systemctl stop {unit} 2>/dev/null
        ip link del {veth_host} 2>/dev/null
        ip netns del {ns} 2>/dev/null
        true
    """
    try:
        proc = sysd.run(["bash", "-c", setup])
        assert proc.returncode == 0, out(proc)
        wait_for("the receiver", (logs / "rx.jsonl").exists, bool, 20)
        yield Receiver(
            f"198.19.{octet}.0/24", f"http://{inside}:{RECEIVER_PORT}", logs / "rx.jsonl"
        )
    finally:
        sysd.run(["bash", "-c", teardown], timeout=60)
        shutil.rmtree(logs, ignore_errors=True)


@dataclass
class WebhookSender:
    """Signs and POSTs like a webhook sender: while the daemon is down or answers 503 it tries
    again with the same event id and a fresh signature (the same signature twice is a replay)."""

    port: int
    secret: str
    signed: set[tuple[int, bytes]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    retries: int = 0

    def post(self, endpoint: str, event_id: str, text: str, deadline: float = 120) -> Any:
        body = json.dumps({"event_id": event_id, "text": text}).encode()
        end = time.monotonic() + deadline
        while True:
            with self.lock:
                stamp = int(time.time())
                while (stamp, body) in self.signed:
                    stamp -= 1
                self.signed.add((stamp, body))
            request = urllib.request.Request(
                f"http://127.0.0.1:{self.port}/hooks/{endpoint}", data=body, method="POST",
                headers={"Content-Type": "application/json",
                         HEADER: sign(self.secret.encode(), stamp, body)},
            )  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:
                    return answer.status, json.loads(answer.read() or b"{}")
            except urllib.error.HTTPError as exc:
                if exc.code != 503:
                    return exc.code, json.loads(exc.read() or b"{}")
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            with self.lock:
                self.retries += 1
            if time.monotonic() > end:
                pytest.fail(f"POST {endpoint} {event_id}: no answer within {deadline:g}s")
            time.sleep(0.2)


class Loop:
    """An asyncio loop in a daemon thread: synchronous tests run matrix-nio calls on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        """Stop and close the loop: an unclosed loop (and its self-pipe sockets) would be
        reported as an unraisable ResourceWarning in whichever test collects it later."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class MatrixUser:
    """One person on the homeserver (a logged-in nio client on the Loop)."""

    def __init__(self, loop: Loop, url: str, user_id: str, device_id: str, token: str) -> None:
        self.loop = loop
        self.user_id = user_id

        async def make() -> nio.AsyncClient:
            client = nio.AsyncClient(url, user_id)
            client.restore_login(user_id, device_id, token)
            return client

        self.client = loop.run(make())

    def create_room(self, invite: list[str]) -> str:
        created = self.loop.run(self.client.room_create(invite=invite))
        assert isinstance(created, nio.RoomCreateResponse), created
        return str(created.room_id)

    def join(self, room: str) -> None:
        joined = self.loop.run(self.client.join(room))
        assert isinstance(joined, nio.JoinResponse), joined

    def invite(self, room: str, user_id: str) -> None:
        done = self.loop.run(self.client.room_invite(room, user_id))
        assert isinstance(done, nio.RoomInviteResponse), done

    def say(self, room: str, body: str, txn: str | None = None) -> str:
        """Send; with ``txn``, a retry after a lost answer is the same event (homeserver de-dup)."""
        content = {"msgtype": "m.text", "body": body}
        for _ in range(5):
            sent = self.loop.run(self.client.room_send(room, "m.room.message", content, tx_id=txn))
            if isinstance(sent, nio.RoomSendResponse):
                return str(sent.event_id)
            time.sleep(0.5)
        raise AssertionError(f"{self.user_id} could not send to {room}: {sent}")

    def timeline(self, room: str) -> list[dict[str, Any]]:
        """Every m.room.message event of the room, oldest first (paged through /messages)."""
        events: list[dict[str, Any]] = []
        token = ""
        while True:
            got = self.loop.run(self.client.room_messages(
                room, start=token, direction=nio.MessageDirection.back, limit=1000))  # fmt: skip
            assert isinstance(got, nio.RoomMessagesResponse), got
            for event in got.chunk:
                source = event.source
                if source.get("type") == "m.room.message":
                    events.append(source)
            if not got.chunk or not got.end or got.end == token:
                break
            token = got.end
        return list(reversed(events))

    def replies_from(self, room: str, bot: str) -> dict[str, list[str]]:
        """The bot's replies in ``room``: answered event id -> the reply bodies."""
        found: dict[str, list[str]] = {}
        for event in self.timeline(room):
            if event.get("sender") != bot:
                continue
            content = event.get("content", {})
            answered = content.get("m.relates_to", {}).get("m.in_reply_to", {}).get("event_id")
            if answered:
                found.setdefault(str(answered), []).append(str(content.get("body", "")))
        return found

    def membership(self, room: str, user_id: str) -> str:
        got = self.loop.run(self.client.room_get_state_event(room, "m.room.member", user_id))
        return str(getattr(got, "content", {}).get("membership", ""))

    def close(self) -> None:
        self.loop.run(self.client.close())
