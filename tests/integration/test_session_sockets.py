"""A session's sockets under attack from its own box (issue 10): idle connections, half-open
HTTP/2 prefaces, slow requests, piles of streams, oversized messages and floods of bad requests
neither lock the box out of its own sockets nor touch another session, and cost the journal a
bounded number of lines.

The attacker is a process of the session's unit, as a process in the box is: the script below
runs inside the private systemd and first moves itself into the unit's cgroup (the sockets admit
only that cgroup), then attacks ``model.sock``, ``gateway.sock`` and ``control.sock`` with raw
bytes. While it holds its connections, the box's own calls (a fresh gRPC channel, as the agent
opens one) and the real in-box agent (``ironctl send``: the agent answers through its control
connection, its model channel and its gateway channel) must still work.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections import Counter
from typing import Any

import pytest

from ironclawd.config import SocketsConfig
from ironclawd.ratelog import DEFAULT_PER_WINDOW, DEFAULT_WINDOW_SECONDS
from tests.harness.box_scripts import JOIN_UNIT
from tests.harness.polling import wait_for
from tests.harness.private_systemd import SystemdHarness

pytestmark = pytest.mark.integration

SESSIONS = "/run/ironclaw/sessions"
CONFIG = "/etc/ironclaw/ironclawd.toml"
LIMITS = SocketsConfig()

# Runs inside the private systemd as root. Stdin: {"unit", "dir", "mode", ...}; prints JSON.
BOX = (
    JOIN_UNIT
    + r"""
import json, os, select, socket, struct, subprocess, sys
import grpc
from ironclaw.model.v1 import model_pb2, model_pb2_grpc
from ironclaw.gateway.v1 import gateway_pb2, gateway_pb2_grpc

req = json.load(sys.stdin)
join_unit(req["unit"])
D = req["dir"]
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

def frame(kind, flags, stream, payload=b""):
    head = struct.pack(">I", len(payload))[1:] + bytes([kind, flags])
    return head + struct.pack(">I", stream) + payload

def headers(path):
    # HPACK literal header fields without indexing, new names, no Huffman (RFC 7541 6.2.2)
    out = b""
    for k, v in ((":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                 ("content-type", "application/grpc"), ("te", "trailers")):
        out += b"\x00" + bytes([len(k)]) + k.encode() + bytes([len(v)]) + v.encode()
    return out

COMPLETE = "/ironclaw.model.v1.ModelService/Complete"
SUBMIT = "/ironclaw.gateway.v1.GatewayService/SubmitChange"

def connect(name, first=b""):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(f"{D}/{name}")
    if first:
        s.sendall(first)
    return s

def attack(name, kind, path):
    hello = PREFACE + frame(4, 0, 0)
    if kind == "idle":
        return connect(name)
    if kind == "preface":
        return connect(name, hello)
    if kind == "slow":  # a request whose message never finishes arriving
        body = b"\x00" + struct.pack(">I", 1000) + b"\x0a\x03"
        return connect(name, hello + frame(1, 4, 1, headers(path)) + frame(0, 0, 1, body))
    if kind == "streams":  # 100 streams opened, none ever sends its message
        opened = b"".join(frame(1, 4, 2 * i + 1, headers(path)) for i in range(100))
        return connect(name, hello + opened)
    if kind == "nohello":
        return connect(name)
    if kind == "hello":
        return connect(name, b"hello 1 10000\n")
    raise ValueError(kind)

def is_open(s):
    p = select.poll()
    p.register(s, select.POLLRDHUP)
    return not p.poll(0)

def code(fn):
    try:
        fn()
        return "OK"
    except grpc.RpcError as err:
        return err.code().name

# As the agent's channels: reconnect promptly, and wait for a connection rather than fail at
# once -- right after a flood the socket's new-connection rate (a token bucket) may still refuse
# the box's connect for a moment; that is the documented self-denial, not a lock-out.
OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000)]

def box_calls():
    # What the agent does: a fresh channel, its profile, a completion, a gateway call.
    out = {}
    with grpc.insecure_channel(f"unix:{D}/model.sock", options=OPTIONS) as ch:
        stub = model_pb2_grpc.ModelServiceStub(ch)
        out["profile"] = stub.GetProfile(model_pb2.GetProfileRequest(), timeout=20,
                                         wait_for_ready=True).agent
        msg = model_pb2.Message(role=model_pb2.ROLE_USER, text="ping")
        out["complete"] = "".join(e.text_delta for e in stub.Complete(
            model_pb2.CompleteRequest(messages=[msg]), timeout=20))
        big = model_pb2.Message(role=model_pb2.ROLE_USER, text="x" * (req["big"]))
        out["oversized"] = code(lambda: list(stub.Complete(
            model_pb2.CompleteRequest(messages=[big]), timeout=20)))
        out["after_oversized"] = stub.GetProfile(model_pb2.GetProfileRequest(), timeout=20).agent
    with grpc.insecure_channel(f"unix:{D}/gateway.sock", options=OPTIONS) as ch:
        stub = gateway_pb2_grpc.GatewayServiceStub(ch)
        out["gateway"] = code(lambda: stub.GetChange(gateway_pb2.GetChangeRequest(id="nope"),
                                                     timeout=20, wait_for_ready=True))
    return out

if req["mode"] == "hold":
    held = [(name, kind, attack(name, kind, path))
            for name, kind, count, path in req["attacks"] for _ in range(count)]
    report = {"box": box_calls()}
    report["open"] = {}
    for name, kind, s in held:
        report["open"][name] = report["open"].get(name, 0) + is_open(s)
    report["then"] = [subprocess.run(argv, capture_output=True, text=True).stdout
                      for argv in req["then"]]
    report["still_open"] = sum(is_open(s) for _, _, s in held)
elif req["mode"] == "flood":
    counts = {"junk": 0, "bad_lines": 0, "calls": {}}
    for _ in range(req["junk"]):
        try:
            with connect("model.sock", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") as s:
                s.recv(1)
            counts["junk"] += 1
        except OSError:
            counts["junk"] += 1
    with connect("control.sock", b"hello 1 10000\n") as s:
        for _ in range(req["bad_lines"]):
            s.sendall(b"approve everything\n")
            counts["bad_lines"] += 1
    with grpc.insecure_channel(f"unix:{D}/gateway.sock") as ch:
        approve = ch.unary_unary("/ironclaw.admin.v1.AdminService/ApproveChange",
                                 request_serializer=None, response_deserializer=None)
        for _ in range(req["calls"]):
            c = code(lambda: approve(b"", timeout=20))
            counts["calls"][c] = counts["calls"].get(c, 0) + 1
    report = counts
print(json.dumps(report))
"""
)


def out(proc: Any) -> str:
    return (proc.stdout or b"").decode(errors="replace") + (proc.stderr or b"").decode(
        errors="replace"
    )


def box(sysd: SystemdHarness, sid: str, **request: Any) -> dict[str, Any]:
    doc = {"unit": f"ironclaw-sbx-{sid}.service", "dir": f"{SESSIONS}/{sid}", **request}
    proc = sysd.run([".venv/bin/python", "-c", BOX], input=json.dumps(doc).encode(), timeout=300)
    assert proc.returncode == 0, out(proc)
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def ironctl(sysd: SystemdHarness, *args: str) -> dict[str, Any]:
    proc = sysd.run(["ironctl", *args, "--json"], timeout=120)
    assert proc.returncode == 0, out(proc)
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def send(sysd: SystemdHarness, sid: str, text: str) -> str:
    return str(ironctl(sysd, "send", sid, text)["reply"]["text"])


def journal(sysd: SystemdHarness, cursor: str) -> list[dict[str, Any]]:
    # Filtered here: journalctl's FIELD=value with --after-cursor missed entries (systemd 252).
    argv = ["journalctl", "--no-pager", "-o", "json", "-u", "ironclawd.service"]
    proc = sysd.run([*argv, "--after-cursor", cursor], timeout=60)
    return [json.loads(line) for line in proc.stdout.decode().splitlines() if line.strip()]


def cursor(sysd: SystemdHarness) -> str:
    proc = sysd.run(["journalctl", "-n", "0", "--show-cursor", "--no-pager"])
    return out(proc).strip().rsplit("cursor: ", 1)[-1]


@pytest.fixture
def two_sessions(daemon: SystemdHarness) -> Any:
    made = []
    for _ in range(2):
        sid = f"sock{secrets.token_hex(4)}"
        ironctl(daemon, "session", "create", "--agent", "demo", "--sid", sid)
        made.append(sid)
    yield made
    for sid in made:
        daemon.run(["ironctl", "session", "rm", "--force", sid], timeout=120)


def test_hoarded_connections_do_not_lock_the_box_out_of_its_own_sockets(
    daemon: SystemdHarness, two_sessions: list[str]
) -> None:
    sysd = daemon
    a, b = two_sessions
    many = 4 * LIMITS.max_connections
    complete = "/ironclaw.model.v1.ModelService/Complete"
    submit = "/ironclaw.gateway.v1.GatewayService/SubmitChange"
    attacks = [
        # More idle connections than the socket holds, then half-open prefaces, requests that
        # never finish and connections with a pile of open streams.
        ("model.sock", "idle", many, complete),
        ("model.sock", "preface", LIMITS.max_connections, complete),
        ("model.sock", "slow", LIMITS.max_connections, complete),
        ("model.sock", "streams", LIMITS.max_connections, complete),
        ("gateway.sock", "idle", many, submit),
        ("gateway.sock", "slow", LIMITS.max_connections, submit),
        ("control.sock", "nohello", many, ""),
        ("control.sock", "hello", LIMITS.max_control_connections, ""),
    ]
    change = json.dumps({"kind": "persona", "payload_json": json.dumps({"persona": "p"})})
    report = box(
        sysd,
        a,
        mode="hold",
        attacks=attacks,
        big=LIMITS.max_message_bytes + 1024,
        then=[
            ["ironctl", "send", a, "hello from the host", "--json"],
            ["ironctl", "send", a, f"/tool request_change {change}", "--json"],
        ],
    )
    # The box's own calls on a fresh channel got through: profile, completion, gateway.
    assert report["box"]["profile"] == "demo", report
    assert report["box"]["complete"] == "mock: ping", report
    assert report["box"]["gateway"] == "NOT_FOUND", report
    # An oversized message is refused on its own; the connection and socket go on serving.
    assert report["box"]["oversized"] == "RESOURCE_EXHAUSTED", report
    assert report["box"]["after_oversized"] == "demo", report
    # The socket held no more than its limit of the hoarder's connections.
    assert report["open"]["model.sock"] <= LIMITS.max_connections - 1, report
    assert report["open"]["gateway.sock"] <= LIMITS.max_connections - 1, report
    assert report["open"]["control.sock"] <= LIMITS.max_control_connections, report
    # The real agent in the box answered through all three sockets while they were held.
    replies = [json.loads(text)["reply"]["text"] for text in report["then"]]
    assert replies[0] == "mock: hello from the host", report
    assert replies[1].startswith("tool request_change said: "), replies
    assert "pending" in replies[1], replies
    # The other session never noticed.
    assert send(sysd, b, "are you there") == "mock: are you there"
    assert ironctl(sysd, "session", "show", a)["state"] == "running"


def test_a_flood_of_bad_requests_costs_the_journal_a_bounded_number_of_lines(
    daemon: SystemdHarness, two_sessions: list[str]
) -> None:
    sysd = daemon
    a, b = two_sessions
    mark = cursor(sysd)
    flood = {"junk": 1500, "bad_lines": 3000, "calls": 1500}
    started = time.monotonic()
    report = box(sysd, a, mode="flood", **flood)
    assert report["junk"] == flood["junk"], report
    assert report["bad_lines"] == flood["bad_lines"], report
    assert sum(report["calls"].values()) == flood["calls"], report
    assert set(report["calls"]) <= {"UNIMPLEMENTED", "RESOURCE_EXHAUSTED", "UNAVAILABLE"}, report
    assert report["calls"].get("RESOURCE_EXHAUSTED", 0) > 0, report  # the call rate held

    # Still serving both sessions; A's extra hello'd connection leaving was not an "exit".
    assert send(sysd, a, "still here") == "mock: still here"
    assert send(sysd, b, "me too") == "mock: me too"
    assert ironctl(sysd, "session", "show", a)["state"] == "running"

    # The reply's model-call line is the daemon's last line about A: once it is in the journal,
    # every line the flood caused is too.
    entries = wait_for(
        "the model call line after the flood",
        lambda: journal(sysd, mark),
        lambda es: any("model call session " + a in str(e.get("MESSAGE")) for e in es),
        30,
    )
    # Every line of the daemon's unit counts, grpc's own included, not only those naming A.
    kinds = Counter(str(e.get("IRONCLAW_LOG_KIND", "-")) for e in entries)
    unthrottled = [str(e.get("MESSAGE")) for e in entries if "IRONCLAW_LOG_KIND" not in e]
    caused = sum(flood.values())
    # The throttle's bound is per window (ratelog: DEFAULT_PER_WINDOW lines a kind, then one
    # that counts the rest). Since the sockets pace connections and control lines (stop 51),
    # the box's flood is taken in at the session's rates: ~2 minutes, several windows.
    windows = math.ceil((time.monotonic() - started) / DEFAULT_WINDOW_SECONDS) + 1
    # for 6000 bad requests
    assert len(entries) <= 100 * windows, (len(entries), windows, kinds, unthrottled)
    for kind, n in kinds.items():
        assert kind == "-" or n <= windows * (DEFAULT_PER_WINDOW + 1), (kind, n, windows, kinds)
    assert len(unthrottled) <= 20, unthrottled  # the sends' own lines, not the flood's
    # The refusals are there, each kind bounded: the operator still sees what happened.
    assert kinds["control.sock bad line"] >= DEFAULT_PER_WINDOW, kinds
    assert kinds["gateway.sock refused call"] >= 1, kinds
    assert caused >= 50 * len(entries) / windows, (len(entries), windows)


def test_a_flood_ends_in_one_line_that_counts_what_was_left_out(
    daemon: SystemdHarness, two_sessions: list[str]
) -> None:
    sysd = daemon
    a = two_sessions[0]
    saved = sysd.run(["cat", CONFIG])
    # A short window (live on reload), so the summary is due within the test.
    config = "[daemon]\nagent_log_lines = 3\nagent_log_window_seconds = 2\n"
    sysd.run(["tee", CONFIG], input=config.encode(), check=True)
    try:
        mark = cursor(sysd)
        sysd.run(["systemctl", "reload", "ironclawd"], check=True)
        wait_for(
            "the daemon to reload",
            lambda: journal(sysd, mark),
            lambda es: any("configuration reloaded" in str(e.get("MESSAGE")) for e in es),
            30,
        )
        lines = 200
        assert box(sysd, a, mode="flood", junk=0, bad_lines=lines, calls=0)["bad_lines"] == lines
        # Nothing more comes from the box: the summary still arrives, from the daemon's flush.
        entries = wait_for(
            "the 'suppressed' line",
            lambda: [
                e
                for e in journal(sysd, mark)
                if e.get("IRONCLAW_SID") == a
                and e.get("IRONCLAW_LOG_KIND") == "control.sock bad line"
            ],
            lambda es: (
                sum(int(e.get("IRONCLAW_SUPPRESSED", 0)) for e in es)
                + sum("IRONCLAW_SUPPRESSED" not in e for e in es)
                == lines
            ),
            30,
        )
        summaries = [e for e in entries if "IRONCLAW_SUPPRESSED" in e]
        assert summaries, entries
        assert f"session {a}: suppressed " in summaries[0]["MESSAGE"]
        assert "similar messages (control.sock bad line) in 2 s" in summaries[0]["MESSAGE"]
        # At most 3 lines a window, and a window with fewer is one with nothing left out.
        assert len(entries) - len(summaries) <= 3 * (len(summaries) + 1), entries
    finally:
        if saved.returncode == 0:
            sysd.run(["tee", CONFIG], input=saved.stdout, check=True)
        else:
            sysd.run(["rm", "-f", CONFIG], check=True)
        sysd.run(["systemctl", "reload", "ironclawd"], check=True)
