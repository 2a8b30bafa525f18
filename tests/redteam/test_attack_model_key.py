"""Attacks on the services a session is given, from inside it, with a canary model key behind
its model proxy (set up as tests/integration/test_model_proxy.py does): the key searched for in
every encoding in every readable file and in what the proxy hands back when the provider echoes
it; every session socket fuzzed (the daemon stays up, another session unaffected); the approval
gateway turned against itself."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.harness.fake_providers import FakeProvider
from tests.harness.private_systemd import SystemdHarness
from tests.redteam.conftest import (
    AGENT,
    RUNNING,
    Sandbox,
    journal_cursor,
    journal_since,
    module_sessions,
    out,
    record,
    sh,
)
from tests.redteam.report import Ledger

pytestmark = pytest.mark.redteam

CONFIG = "/etc/ironclaw/ironclawd.toml"
CREDENTIALS = "/etc/ironclaw/credentials"
TAG = secrets.token_hex(4)
MODEL_AGENT = f"rt-key-{TAG}"


def masked(label: str, secret: bytes) -> str:
    """``label:PAD:MASKED`` for redteam_probe/probes/secrets.py: no encoding of ``secret`` in
    argv."""
    pad = secrets.token_bytes(len(secret))
    return f"{label}:{pad.hex()}:{bytes(a ^ b for a, b in zip(secret, pad, strict=True)).hex()}"


@dataclass
class World:
    sysd: SystemdHarness
    key: str
    fake: FakeProvider
    box: Sandbox
    other: Sandbox  # a session of another agent, which must not notice any of this
    raw: dict[str, dict[str, Any]]
    journal: str


def _config(fake: FakeProvider) -> str:
    return f"""
[agents.{MODEL_AGENT}]
provider = "anthropic"
model = "claude-fake-1"
base_url = "{fake.base_url}"
credential = "anthropic-{TAG}"
requests_per_minute = 1000
session_requests_per_minute = 1000

# The socket attacks open a new connection each (fuzzers, then the gateway probes back to back):
# on a fast host that passed [sockets] connections_per_second (20), and gateway.replay's two
# submissions were refused UNAVAILABLE before the gateway saw them. What is tested here is the
# gateway's answer; the connection meter has its own tests.
[sockets]
connections_per_second = 1000.0
"""


@pytest.fixture(scope="module")
def world(daemon: SystemdHarness) -> Iterator[World]:
    fake = FakeProvider("anthropic").start()
    key = f"sk-ant-api03-RTCANARY-{secrets.token_hex(16)}"
    path = f"{CREDENTIALS}/anthropic-{TAG}"
    try:
        # Through stdin: the canary is in no argv, not even the test's own.
        proc = sh(daemon, f"install -d -m 0700 {CREDENTIALS} && umask 077 && cat > {path}",
                  input=key.encode())  # fmt: skip
        assert proc.returncode == 0, out(proc)
        daemon.run(["tee", CONFIG], input=_config(fake).encode(), check=True)
        proc = sh(daemon, "systemctl reset-failed ironclawd; systemctl restart ironclawd")
        assert proc.returncode == 0, out(proc)
        with module_sessions(daemon) as sessions:
            box, other = sessions.create(MODEL_AGENT), sessions.create(AGENT)
            # The key really transits: the provider receives it and echoes it back.
            assert "[REDACTED]" in box.send("/echo-key-text")
            assert {fake.key_of(r) for r in fake.requests} == {key}
            theirs = other.send("before")
            assert theirs.endswith("before"), theirs
            # A change by another session, for the peek attack.
            change = _submit_from_host(daemon, other)
            mark = journal_cursor(daemon)
            raw: dict[str, dict[str, Any]] = {}
            needles = masked("model-key", key.encode())
            raw.update(box.attacks("secrets", needles=needles, only="secrets.files,"
                                   "secrets.model-echo", timeout=600))  # fmt: skip
            raw.update(box.attacks("sockets", other_agent=AGENT, other_change=change))
            yield World(daemon, key, fake, box, other, raw, journal_since(daemon, mark))
    finally:
        fake.stop()
        proc = sh(daemon, f"rm -f {CONFIG} {path}; systemctl reset-failed ironclawd; "
                  "systemctl restart ironclawd")  # fmt: skip
        assert proc.returncode == 0, out(proc)


def _submit_from_host(sysd: SystemdHarness, box: Sandbox) -> str:
    """A change submitted on ``box``'s gateway.sock by a process joined to its unit (as the
    box's own agent would), its id."""
    group = out(sysd.run(["systemctl", "show", "-P", "ControlGroup", box.unit])).strip()
    code = (
        "import grpc,sys,json\n"
        f"open('/sys/fs/cgroup/systemd{group}/cgroup.procs','w').write('0')\n"
        "from ironclaw.gateway.v1 import gateway_pb2 as g, gateway_pb2_grpc as s\n"
        f"c=grpc.insecure_channel('unix:/run/ironclaw/sessions/{box.sid}/gateway.sock')\n"
        "r=s.GatewayServiceStub(c).SubmitChange(g.SubmitChangeRequest(kind='persona',"
        "payload_json=json.dumps({'persona':'peek me'}),reason='peek'),timeout=30)\n"
        "print(r.change.id)\n"
    )
    proc = sysd.run([".venv/bin/python", "-c", code])
    assert proc.returncode == 0, out(proc)
    return out(proc).strip()


def _session_still_serves(world: World) -> tuple[bool, str]:
    own = world.box.send("after the attack")
    theirs = world.other.send("after the attack")
    ok = (world.box.state(), world.other.state()) == (RUNNING, RUNNING)
    ok = ok and theirs.endswith("after the attack") and bool(own)
    status = world.sysd.run(["ironctl", "status", "--json"])
    ok = ok and status.returncode == 0
    return ok, f"both sessions running and answering, ironctl status exit {status.returncode}"


@pytest.mark.parametrize("attack_id", ["secrets.files", "secrets.model-echo"])
def test_model_key_canary_never_reaches_the_box(
    world: World, ledger: Ledger, attack_id: str
) -> None:
    raw = world.raw[attack_id]
    journal_clean = world.key not in world.journal
    contained = raw["ok"] is False and journal_clean
    where = (
        "every readable file (incl. /proc/*/environ, cmdline)"
        if attack_id == "secrets.files"
        else "the proxy's answers to four provider echoes (text, tool call, \\u-escaped, 401), "
        "streamed (Complete) and whole (Answer)"
    )
    record(
        ledger, attack_id.replace("secrets.", "secrets.model-key."), "secrets",
        f"find the model key canary in {where}, in 19 encodings", contained,
        f"{raw['detail']}; key absent from the journal: {journal_clean}", error=raw["ok"] is None,
    )  # fmt: skip
    assert contained, raw


FUZZ = ("sockets.fuzz.model", "sockets.fuzz.gateway", "sockets.fuzz.control",
        "sockets.control.no-hello")  # fmt: skip


@pytest.mark.parametrize("attack_id", FUZZ)
def test_fuzzed_socket_leaves_the_daemon_serving(
    world: World, ledger: Ledger, attack_id: str
) -> None:
    raw = world.raw[attack_id]
    serving, note = _session_still_serves(world)
    # For control.sock the probe only sends: what counts is that everything still works.
    inside = raw["ok"] is False or attack_id.startswith("sockets.fuzz.control") or \
        attack_id == "sockets.control.no-hello"  # fmt: skip
    contained = inside and serving and raw["ok"] is not None
    title = {
        "sockets.fuzz.model": "random, truncated and oversized gRPC/HTTP/2 frames to model.sock",
        "sockets.fuzz.gateway": "random, truncated and oversized gRPC/HTTP/2 frames to "
        "gateway.sock",
        "sockets.fuzz.control": "random bytes, bad events, a 70 KB line to control.sock",
        "sockets.control.no-hello": "an over-long line instead of a hello on control.sock",
    }[attack_id]
    record(ledger, attack_id, "sockets", title, contained, f"{raw['detail']}; {note}",
           error=raw["ok"] is None)  # fmt: skip
    assert contained, (raw, note)


GATEWAY = {
    "gateway.approve-own-change": "approve a change from the session's own gateway.sock",
    "gateway.forged-agent": "submit a change for another agent (forged target)",
    "gateway.peek-other-session": "read another session's pending change",
    "gateway.replay": "replay one submission: never approved, nothing applied",
}


@pytest.mark.parametrize("attack_id", sorted(GATEWAY))
def test_gateway_turned_against_itself(world: World, ledger: Ledger, attack_id: str) -> None:
    raw = world.raw[attack_id]
    sysd = world.sysd
    changes = json.loads(out(sysd.run(["ironctl", "change", "list", "--json"])) or "{}")
    listing = json.dumps(changes)
    agent = json.loads(out(sysd.run(["ironctl", "agent", "show", MODEL_AGENT, "--json"])) or "{}")
    persona_untouched = "red team" not in json.dumps(agent)
    inside = raw["ok"] is False
    note = f"no change applied: {persona_untouched}"
    if attack_id == "gateway.replay":
        # Submitting is allowed; what matters is that neither copy is approved or applied.
        detail = json.loads(raw["detail"]) if raw["ok"] else {}
        ids = [detail.get("first"), detail.get("second")]
        pending = all(i and i in listing for i in ids) and "approved" not in json.dumps(
            [c for c in changes.get("changes", []) if c.get("id") in ids]
        )
        inside = bool(raw["ok"]) and ids[0] != ids[1] and pending
        note += f"; two distinct pending changes {ids}: {pending}"
    if attack_id == "gateway.approve-own-change":
        note += "; refusals audited: " + str("no such method" in world.journal)
    contained = inside and persona_untouched
    record(ledger, attack_id, "gateway", GATEWAY[attack_id], contained,
           f"{raw['detail'][:250]}; {note}", error=raw["ok"] is None)  # fmt: skip
    assert contained, (raw, note)
