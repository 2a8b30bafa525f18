"""Real sessions driven from the test process: `Box` (one session, acted on from outside and
inside) and `Boxes` (the sessions a test made), plus the two ways tests get them.

`restarted_with` restarts the daemon with a config of the test's and puts the default one back
afterwards; `open_boxes` yields a `Boxes` on the admin socket and removes, pass or fail, every
session still listed when the test ends. The integration tests of messages, ingest and the
outbound mount namespace share these rather than each keeping a copy.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import sqlcipher3

from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from tests.harness.polling import session_netns
from tests.harness.private_systemd import SystemdHarness
from tests.harness.probe import PROBE_IN_BOX

SOCKET = "/run/ironclaw/admin.sock"
CONFIG = "/etc/ironclaw/ironclawd.toml"
STATE_DIR = "/var/lib/ironclaw"
QUEUES = f"{STATE_DIR}/queues"
KEYS = "/run/ironclaw/keys"
RUNSC_ROOT = "/run/ironclaw/runsc"
AGENT_UID = 10000
RPC_TIMEOUT = 60.0


def out(proc: Any) -> str:
    """A finished process's stdout and stderr, as text."""
    return (proc.stdout or b"").decode(errors="replace") + (proc.stderr or b"").decode(
        errors="replace"
    )


def sh(sysd: SystemdHarness, script: str, **kwargs: Any) -> Any:
    return sysd.run(["bash", "-c", script], **kwargs)


def open_db(path: Path, key: bytes, *, read_only: bool = True) -> sqlcipher3.Connection:
    uri = f"file:{path}?mode=ro" if read_only else f"file:{path}"
    conn = sqlcipher3.connect(uri, uri=True, isolation_level=None)
    conn.execute(f"PRAGMA key = \"x'{key.hex()}'\"")
    return conn


@contextlib.contextmanager
def host_copy(src: Path, tmp_path: Path, *, write_back: bool = False) -> Iterator[Path]:
    """A copy of a database that lives in the private systemd, to open on the host side.

    SQLite resolves symlinks in a database path, and ``/proc/<pid>/root`` reads as ``/``, so it
    cannot open a file through ``host_path`` (plain reads and writes can). With ``write_back``
    the edited copy is written over the original in place: same inode, owner and mode.
    """
    where = tmp_path / f"db-{secrets.token_hex(4)}"
    where.mkdir()
    for suffix in ("", "-wal", "-journal"):
        part = Path(f"{src}{suffix}")
        if part.exists():
            shutil.copyfile(part, where / part.name)
    yield where / src.name
    if write_back:
        data = (where / src.name).read_bytes()
        with open(src, "r+b") as original:
            original.write(data)
            original.truncate()


@dataclass
class Box:
    """One real session: its id and the means to act on it from outside and inside."""

    sysd: SystemdHarness
    stub: admin_pb2_grpc.AdminServiceStub
    sid: str

    @property
    def unit(self) -> str:
        return f"ironclaw-sbx-{self.sid}.service"

    def path(self, inside: str) -> Path:
        return self.sysd.host_path(inside)

    @property
    def inbound_db(self) -> Path:
        return self.path(f"{QUEUES}/{self.sid}/inbound/inbound.db")

    @property
    def outbound_db(self) -> Path:
        """Where the daemon's outbound mount namespace has it (not the host's mount table)."""
        return self.sysd.outbound_path(f"{QUEUES}/{self.sid}/outbound/outbound.db")

    @property
    def key_file(self) -> Path:
        return self.path(f"{KEYS}/{self.sid}")

    def key(self) -> bytes:
        return bytes.fromhex(self.key_file.read_text())

    def send(self, text: str, client_id: str = "") -> admin_pb2.SendMessageResponse:
        request = admin_pb2.SendMessageRequest(sid=self.sid, text=text, client_id=client_id)
        reply: admin_pb2.SendMessageResponse = self.stub.SendMessage(request, timeout=RPC_TIMEOUT)
        return reply

    def exchange(self, text: str, timeout: float = 30.0) -> float:
        """Send ``text``, see the mock model's reply to it within ``timeout`` seconds (a
        deadline for a wedged run, not a timing assertion); how long that took."""
        started = time.monotonic()
        sent = self.send(text)
        replies = self.wait_replies(1, after=sent.replies_before, timeout=timeout)
        assert [r.text for r in replies] == [f"mock: {text}"], replies
        return time.monotonic() - started

    def replies(self, after: int = 0) -> list[admin_pb2.Reply]:
        request = admin_pb2.WatchRepliesRequest(sid=self.sid, after_seq=after, follow=False)
        return [r.reply for r in self.stub.WatchReplies(request, timeout=RPC_TIMEOUT)]

    def wait_replies(self, count: int, after: int = 0, timeout: float = 60) -> list[Any]:
        """Follow the stream until ``count`` replies after ``after`` arrived (bounded)."""
        request = admin_pb2.WatchRepliesRequest(sid=self.sid, after_seq=after, follow=True)
        got: list[admin_pb2.Reply] = []
        call = self.stub.WatchReplies(request, timeout=timeout)
        try:
            for item in call:
                got.append(item.reply)
                if len(got) >= count:
                    break
        finally:
            call.cancel()
        return got

    def runsc(self, *argv: str) -> Any:
        """runsc as root inside the session's netns (runsc reaches its sandbox through an
        abstract socket, which belongs to a network namespace)."""
        netns = session_netns(self.sysd, self.sid)
        return self.sysd.run(
            ["nsenter", f"--net={netns}", "runsc", f"--root={RUNSC_ROOT}", *argv], timeout=60
        )

    def probe_paths(self, *paths: str) -> dict[str, Any]:
        user = f"{AGENT_UID}:{AGENT_UID}"
        args = [f"--probe-path={p}" for p in paths]
        proc = self.runsc("exec", "--user", user, f"ironclaw-{self.sid}", PROBE_IN_BOX, *args)
        assert proc.returncode == 0, out(proc)
        report: dict[str, Any] = json.loads(proc.stdout)
        paths_seen: dict[str, Any] = report["paths"]
        return paths_seen


@dataclass
class Boxes:
    """Sessions of one agent, made through the admin API; ``made`` lists those not removed."""

    sysd: SystemdHarness
    stub: admin_pb2_grpc.AdminServiceStub
    agent: str
    made: list[Box] = field(default_factory=list)

    def create(self) -> Box:
        created = self.stub.CreateSession(
            admin_pb2.CreateSessionRequest(agent=self.agent), timeout=RPC_TIMEOUT
        )
        assert created.session.state == admin_pb2.SESSION_STATE_RUNNING, created
        box = Box(self.sysd, self.stub, created.session.sid)
        self.made.append(box)
        return box

    def remove(self, box: Box) -> None:
        self.stub.RemoveSession(
            admin_pb2.RemoveSessionRequest(sid=box.sid, force=True), timeout=RPC_TIMEOUT
        )
        self.made.remove(box)


def restart(daemon: SystemdHarness) -> None:
    """``systemctl restart ironclawd`` (the daemon fixture lifts systemd's start limit)."""
    proc = sh(daemon, "systemctl restart ironclawd", timeout=120)
    assert proc.returncode == 0, out(proc)


@contextlib.contextmanager
def restarted_with(daemon: SystemdHarness, config: str) -> Iterator[None]:
    """The daemon restarted with ``config`` as its config file; afterwards, pass or fail, the
    file removed and the daemon restarted on the defaults."""
    daemon.run(["tee", CONFIG], input=config.encode(), check=True)
    try:
        restart(daemon)
        yield
    finally:
        daemon.run(["rm", "-f", CONFIG], check=True)
        restart(daemon)


@contextlib.contextmanager
def open_boxes(daemon: SystemdHarness, agent: str) -> Iterator[Boxes]:
    """Sessions of ``agent``; every one left at the end is removed, and a removal that fails
    fails the test."""
    with grpc.insecure_channel(f"unix:{daemon.host_path(SOCKET)}") as channel:
        made = Boxes(daemon, admin_pb2_grpc.AdminServiceStub(channel), agent)
        yield made
        failures = []
        for box in list(made.made):
            proc = daemon.run(["ironctl", "session", "rm", "--force", box.sid], timeout=120)
            if proc.returncode != 0:
                failures.append(f"{box.sid}: {out(proc)}")
        assert not failures, failures
