"""The baseline sandbox: what ironclawd runs, without ironclawd.

``BareSandbox`` does by hand, in the benchmark process, what a session's bring-up does, with the
daemon's own pure functions and adapters: a fresh network namespace (``NetnsAdapter``), a session
key on tmpfs and the queue directories (outbound on its quota tmpfs), the spec ``build_spec``
writes for the same agent image and mounts, the same ``runsc run`` argv (``runsc_argv``: same
platform and flags) started under ``nsenter`` in that netns, and the same agent program in the
box, up to the same ready point: the agent's ``hello`` on the session's control socket. Not
done: the state database, the audit log, the transient systemd unit and its cgroup limits
(``linux.resources`` is dropped: outside a unit runsc has no cgroup of its own to configure),
the gRPC admin call. Teardown mirrors the daemon's (``runsc delete -force``, netns, bundle,
sockets, key, queues).

Messages go the agent's real way: append to inbound.db (``InboundWriter``), ``inbound <seq>`` on
the control connection, the agent asks a stub model on ``model.sock`` (answers at once), writes
outbound.db and says ``outbound <seq>``, which is read back with the daemon's
``OutboundReader``. So a round trip here is the agent's work in gVisor plus the queues, without
gRPC, the state database, the proxy's budgets and audit, or the daemon's event loop.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from ironclaw.model.v1 import model_pb2, model_pb2_grpc
from ironclawd import paths
from ironclawd.api.sockets import bind_unix_socket
from ironclawd.bundle.spec import SOCKETS_DIR, build_spec, session_mounts
from ironclawd.bundle.writer import write_bundle
from ironclawd.domain.agents import AGENT_GID, AGENT_UID
from ironclawd.domain.policy import SandboxPolicy
from ironclawd.domain.session import new_sid
from ironclawd.errors import IronclawError
from ironclawd.host import runsc
from ironclawd.host.netns import NetnsAdapter
from ironclawd.store.keys import new_session_key, remove_tmpfs_key, write_tmpfs_key
from ironclawd.store.outbound import OutboundReader
from ironclawd.store.queues import InboundWriter, prepare_queue_dirs, remove_queue_dirs
from ironclawd.store.quota_mount import OutboundQuota

BUNDLES = paths.STATE_DIR / "bundles"
AGENT_ARGV = ("/app/agent/agent",)
QUOTA = OutboundQuota(64 * 1024 * 1024, 1000)
START_TIMEOUT = 60.0


def agent_rootfs() -> Path:
    """The agent image the daemon's sessions run (read from a live session's bundle)."""
    for config in sorted(BUNDLES.glob("*/config.json")):
        return Path(json.loads(config.read_text())["root"]["path"])
    raise SystemExit("bench: no session bundle to read the agent image from (create one first)")


class _StubModel(model_pb2_grpc.ModelServiceServicer):
    """Answers every completion at once with ``mock: <last text>`` (the daemon's mock model
    says the same through the proxy)."""

    def GetProfile(self, request: Any, context: Any) -> model_pb2.GetProfileResponse:
        return model_pb2.GetProfileResponse(agent="bare", max_tool_rounds=4)

    def Answer(self, request: Any, context: Any) -> model_pb2.AnswerResponse:
        """What the agent asks: the whole turn in one message."""
        return model_pb2.AnswerResponse(text=f"mock: {request.messages[-1].text}")

    def Complete(self, request: Any, context: Any) -> Iterator[model_pb2.CompleteResponse]:
        yield model_pb2.CompleteResponse(text_delta=f"mock: {request.messages[-1].text}")
        if not request.text_and_tool_calls_only:  # as the daemon's proxy does: what was asked
            yield model_pb2.CompleteResponse(stop_reason="end_turn")


def _read_settled(reader: OutboundReader, after: int) -> list[Any]:
    """``read_after``, tried again while the agent keeps committing ("no quiet moment"), as the
    daemon's ingest tries again at the next announcement: at 50 busy sandboxes on 2 cores a
    read can find the file changing 50 times running."""
    for _attempt in range(100):
        try:
            return list(reader.read_after(after, 1000, 1 << 20))
        except IronclawError:
            time.sleep(0.01)
    return list(reader.read_after(after, 1000, 1 << 20))


class BareSandbox:
    def __init__(
        self,
        info: runsc.RunscInfo,
        platform: str,
        rootfs: Path,
        *,
        model: bool = True,
        replies: queue.Queue[tuple[str, int, float]] | None = None,
    ) -> None:
        self.info, self.platform, self.rootfs, self.model = info, platform, rootfs, model
        self.sid = new_sid()
        self.work = Path(tempfile.mkdtemp(prefix="ironclaw-bare-"))
        self.sockets = paths.SESSIONS_RUN_DIR / self.sid
        self.netns_name = f"ironclaw-{self.sid}"
        self.key = b""
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: socket.socket | None = None
        self.listener: socket.socket | None = None
        self.server: grpc.Server | None = None
        self.writer: InboundWriter | None = None
        # (sid, seq of the message answered, perf_counter when the reply was read back)
        self.replies: queue.Queue[tuple[str, int, float]] = (
            queue.Queue() if replies is None else replies
        )
        self._reader: threading.Thread | None = None
        self._send_lock = threading.Lock()
        self.steps: dict[str, float] = {}  # seconds from the start of bring-up

    @property
    def state_dir(self) -> Path:
        return self.work / "state"

    def start(self) -> None:
        """Everything up to the agent's hello; raises (after undoing) if it does not come."""
        try:
            self._bring_up()
        except BaseException:
            self.stop()
            raise

    def _bring_up(self) -> None:
        started = time.perf_counter()
        self.sockets.mkdir(mode=0o711, parents=True, exist_ok=True)
        self.listener = bind_unix_socket(self.sockets / "control.sock", mode=0o666, group=None)
        self.listener.listen(4)
        if self.model:
            self.server = grpc.server(futures.ThreadPoolExecutor(2))
            model_pb2_grpc.add_ModelServiceServicer_to_server(_StubModel(), self.server)
            self.server.add_insecure_port(f"unix:{self.sockets / 'model.sock'}")
            self.server.start()
            os.chmod(self.sockets / "model.sock", 0o666)
        netns = NetnsAdapter().create(self.netns_name)
        self.key = new_session_key()
        prepare_queue_dirs(self.state_dir / "queues", self.sid, AGENT_UID, AGENT_GID, QUOTA)
        write_tmpfs_key(paths.KEYS_RUN_DIR / self.sid, self.key, AGENT_UID, AGENT_GID)
        policy = SandboxPolicy(
            sid=self.sid, agent="bare", uid=AGENT_UID, gid=AGENT_GID, host_uid=AGENT_UID,
            host_gid=AGENT_GID, rootfs=str(self.rootfs), netns=str(netns), argv=AGENT_ARGV,
            env=(("IRONCLAW_CONTROL_SOCKET", f"{SOCKETS_DIR}/control.sock"),
                 ("IRONCLAW_SID", self.sid)),
            mounts=session_mounts(self.sid, self.state_dir),
        )  # fmt: skip
        spec = build_spec(policy, (), self.state_dir)
        del spec["linux"]["resources"]
        bundle = self.work / "bundle"
        write_bundle(bundle, spec, (), self.state_dir)
        argv = runsc.runsc_argv(
            self.info, root=self.work / "runsc", bundle=bundle, container_id=self.sid,
            platform=self.platform, host_uds=True,
        )  # fmt: skip
        log = open(self.work / "runsc.log", "wb")  # noqa: SIM115 (the child holds it)
        self.proc = subprocess.Popen(
            ["nsenter", f"--net={netns}", *argv], stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
        log.close()
        self.steps["set-up"] = time.perf_counter() - started
        self.listener.settimeout(START_TIMEOUT)
        try:
            conn, _ = self.listener.accept()
        except TimeoutError:
            tail = (self.work / "runsc.log").read_text(errors="replace")[-400:]
            raise SystemExit(f"bench: bare sandbox said no hello: {tail}") from None
        conn.settimeout(START_TIMEOUT)
        hello = b""
        while not hello.endswith(b"\n"):
            chunk = conn.recv(256)
            if not chunk:
                raise SystemExit("bench: bare sandbox closed its control connection")
            hello += chunk
        if not hello.startswith(b"hello "):
            raise SystemExit(f"bench: bare sandbox said {hello!r}")
        conn.settimeout(None)
        self.conn = conn
        self.steps["hello"] = time.perf_counter() - started

    # -- messages ------------------------------------------------------------------------

    def open_messages(self) -> None:
        """The host side of the message path: the inbound writer and a reader of the agent's
        ``outbound <seq>`` lines that reads each reply back (``replies`` gets (sid, seq answered,
        time read))."""
        queues = self.state_dir / "queues" / self.sid
        self.writer = InboundWriter(queues / "inbound", self.key, AGENT_GID)
        scratch = self.work / "scratch"
        scratch.mkdir(mode=0o700, exist_ok=True)
        reader = OutboundReader(queues / "outbound", self.key, AGENT_UID, scratch, QUOTA.max_bytes)
        self._reader = threading.Thread(target=self._read_replies, args=(reader,), daemon=True)
        self._reader.start()

    def _read_replies(self, reader: OutboundReader) -> None:
        assert self.conn is not None
        pending, last = b"", 0
        try:
            while chunk := self.conn.recv(65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if not any(line.startswith(b"outbound ") for line in lines):
                    continue
                for seq, in_reply_to, _at, _body in _read_settled(reader, last):
                    last = seq
                    answered = in_reply_to if isinstance(in_reply_to, int) else -1
                    self.replies.put((self.sid, answered, time.perf_counter()))
        except OSError:
            pass
        finally:
            reader.close()

    def send(self, text: str) -> int:
        """Append and announce one message; its seq."""
        assert self.writer is not None
        assert self.conn is not None
        with self._send_lock:  # announces in seq order, one line at a time
            seq, _ = self.writer.append(text, time.time(), None)
            self.conn.sendall(f"inbound {seq}\n".encode())
        return seq

    # -- teardown ------------------------------------------------------------------------

    def stop(self) -> None:
        """What the daemon's teardown does, in its order; safe to repeat."""
        if self.proc is not None:
            # As systemd's stop of the unit does: SIGTERM to runsc run, which passes it on.
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [str(self.info.path), f"--root={self.work / 'runsc'}", "delete", "-force",
                     self.sid], capture_output=True, timeout=30, check=False,
                )  # fmt: skip
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        with contextlib.suppress(Exception):
            NetnsAdapter().delete(self.netns_name)
        for closing in (self.conn, self.listener):
            if closing is not None:
                closing.close()
        self.conn = self.listener = None
        if self.server is not None:
            self.server.stop(None)
            self.server = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self._reader is not None:
            self._reader.join(5)
            self._reader = None
        shutil.rmtree(self.sockets, ignore_errors=True)
        with contextlib.suppress(Exception):
            remove_tmpfs_key(paths.KEYS_RUN_DIR / self.sid)
        with contextlib.suppress(Exception):
            remove_queue_dirs(self.state_dir / "queues", self.sid)
        shutil.rmtree(self.work, ignore_errors=True)
